"""What a layout pays after its pipelines: block-wise gradient sync and the optimizer step.

The same rules as `hetpp.cost.step`, at template granularity, so the search can rank layouts
without placing them: the layer list is cut at every template's stage boundaries; each block is
all-reduced over one owner per pipeline; blocks with the same owning stages form one bucket (a
device running several chunks has one per chunk); buckets run latest layers first, each when its
stages' gradients are final and its owners are free of earlier ones. Mixing
templates with different boundaries makes more buckets that chain through shared owners: that is
the price of heterogeneous splits the search must see.
"""

from __future__ import annotations

import bisect
import itertools

from hetpp.cost.comm import allreduce_time_s, ring_link, ring_pass_time_s, scalar_allreduce_time_s
from hetpp.cost.params import tied_copy_params
from hetpp.cost.sync import run_buckets, step_end_s
from hetpp.planner.shapes import ShapeContext, TemplateCost
from hetpp.specs.cluster import Link

Group = tuple[int, int]
"""(template index in the layout, device as its one-chunk stage index): the `count` owners
standing for that device."""


def layout_tail(ctx: ShapeContext, layout: list[tuple[TemplateCost, int]]) -> float:
    """Seconds from the end of the slowest pipeline to the end of the step (sync, the gradient
    norm's all-reduce over every device, optimizer), assuming every pipeline ends together
    (data balance makes them nearly so). A template
    priced under a multi-chunk schedule has a bucket per chunk, ready when that chunk's
    gradients are final (`TemplateCost.sync_stages`), as `hetpp.cost.step.sync_buckets`."""
    train = ctx.cm.train
    replicas = sum(n for _, n in layout)
    link = _sync_link(ctx, layout)
    sync = [t.sync_stages for t, _ in layout]
    # Owners are (template index, device); each is done at its latest stage's final gradients,
    # all before the pipelines' common end (0).
    done: dict[Group, float] = {}
    for i, (_, devices, final) in enumerate(sync):
        for d, f in zip(devices, final):
            done[i, d] = max(done.get((i, d), f), f)
    cuts = sorted({c for bounds, _, _ in sync for c in bounds})
    # per block, the owning stage of each template (bisection on its cuts: a few dozen blocks,
    # too few for numpy to pay)
    stage = [[bisect.bisect_right(b, c) - 1 for c in cuts[:-1]] for b, _, _ in sync]
    buckets: dict[tuple[int, ...], list[float]] = {}  # stages -> [params, last block start]
    pools = ctx.problem.pools
    tps = [[pools[k].tp for k in t.stage_keys] for t, _ in layout]
    any_tp = any(x != 1 for row in tps for x in row)
    for (a, b), stages in zip(itertools.pairwise(cuts), zip(*stage)):
        entry = buckets.setdefault(stages, [0.0, 0])
        # each TP rank syncs its shard: the owner of least degree sets the bucket's size
        tp = min(x[sy[1][s]] for x, sy, s in zip(tps, sync, stages)) if any_tp else 1
        entry[0] += ctx.params.synced(a, b, tp)
        entry[1] = a
    # As `hetpp.specs.plan.grad_buckets`: latest layers first; then the tied bucket. Sharded
    # (the search's `optimizer_shards`): a reduce-scatter each, an all-gather after the step.
    grad, sharded = train.grad_bytes_per_param, ctx.problem.optimizer_shards > 1
    ring = ring_pass_time_s if sharded else allreduce_time_s
    ordered = sorted(buckets.items(), key=lambda kv: -kv[1][1])
    owners = [
        tuple((i, sy[1][s]) for i, (sy, s) in enumerate(zip(sync, stages))) for stages, _ in ordered
    ]
    ready = [
        max([sy[2][s] for sy, s in zip(sync, stages)]) for stages, _ in ordered
    ]  # fmt: skip
    links = [_bucket_link(ctx, layout, own, link) for own in owners]
    order = [
        (own, ring(params * grad, replicas, lk))
        for own, (_, (params, _)), lk in zip(owners, ordered, links)
    ]
    gathers = [
        (own, ring_pass_time_s(params * train.dtype_bytes, replicas, lk))
        for own, (_, (params, _)), lk in zip(owners, ordered, links)
        if sharded
    ]
    tied = _tied(ctx, layout, link)
    order += tied
    ready += [max([done[o] for o in own]) for own, _ in tied]
    _, free = run_buckets(order, done, ready)
    opt = {(i, s): x for i, (t, _) in enumerate(layout) for s, x in enumerate(t.opt_s)}
    ranks = sum(n * len(set(t.sync_stages[1])) for t, n in layout)  # the norm's: every device
    norm_s = scalar_allreduce_time_s(ranks, link)
    return step_end_s(free, dict.fromkeys(free, 0.0), opt, gathers, norm_s=norm_s)


def _tied(ctx: ShapeContext, layout, link: Link) -> list[tuple[list[Group], float]]:
    """Tied embedding/head: first and last stages of every pipeline also sum that matrix."""
    extra = tied_copy_params(ctx.cm.model)
    if extra == 0 or all(t.num_stages == 1 for t, _ in layout):
        return []
    # the first and last stages' devices (a V's last stage is back on its first device)
    holders = {(i, t.sync_stages[1][0]) for i, (t, _) in enumerate(layout)} | {
        (i, t.sync_stages[1][-1]) for i, (t, _) in enumerate(layout)
    }
    count = sum(n * len({t.sync_stages[1][0], t.sync_stages[1][-1]}) for t, n in layout)
    return [
        (sorted(holders), allreduce_time_s(extra * ctx.cm.train.grad_bytes_per_param, count, link))
    ]


def _sync_link(ctx: ShapeContext, layout, keys: set[str] | None = None) -> Link:
    """The ring over owners of the GPU types `keys` (default: every type the layout uses):
    inside one node if they are of one type whose devices in the layout fit one of its nodes
    (placement then packs them there) or the cluster is one node, else across nodes."""
    pools = ctx.problem.pools
    keys = keys or {k for t, _ in layout for k in t.stage_keys}
    used = {k: sum(n * c for t, n in layout for kk, c in t.runs if kk == k) for k in keys}
    one_node = len(keys) == 1 and all(used[k] <= pools[k].gpus_per_node for k in keys)
    spans = not (one_node or ctx.problem.num_nodes == 1)
    return ring_link(ctx.problem.cluster, (pools[k].intra_bw_bytes_per_s for k in keys), spans)


def _bucket_link(ctx: ShapeContext, layout, owners: tuple[Group, ...], whole: Link) -> Link:
    """One bucket's ring: its owners' types decide (mixed pipelines whose stages of one type
    share a node sync those stages inside it); `whole` when they span types."""
    keys = {layout[i][0].stage_keys[d] for i, d in owners}
    return _sync_link(ctx, layout, keys) if len(keys) == 1 else whole
