"""What a layout pays after its pipelines: block-wise gradient sync and the optimizer step.

The same rules as `hetpp.cost.step`, at template granularity, so the search can rank layouts
without placing them: the layer list is cut at every template's stage boundaries; each block is
all-reduced over one owner per pipeline; blocks with the same owners form one bucket; buckets run
latest layers first, each when its owners are done with backward and free of earlier ones. Mixing
templates with different boundaries makes more buckets that chain through shared owners: that is
the price of heterogeneous splits the search must see.
"""

from __future__ import annotations

import bisect
import itertools

from hetpp.cost.comm import allreduce_time_s, ring_link, ring_pass_time_s
from hetpp.cost.params import tied_copy_params
from hetpp.cost.sync import run_buckets, step_end_s
from hetpp.planner.shapes import ShapeContext, TemplateCost
from hetpp.specs.cluster import Link

Group = tuple[int, int]
"""(template index in the layout, stage): the `count` owners standing for that stage."""


def layout_tail(ctx: ShapeContext, layout: list[tuple[TemplateCost, int]]) -> float:
    """Seconds from the end of the slowest pipeline to the end of the step (sync + optimizer),
    assuming every pipeline ends together (data balance makes them nearly so)."""
    train = ctx.cm.train
    replicas = sum(n for _, n in layout)
    link = _sync_link(ctx, layout)
    # Each (template, stage) is done before the pipelines' common end (0).
    done: dict[Group, float] = {
        (i, s): d for i, (t, _) in enumerate(layout) for s, d in enumerate(t.done_s)
    }
    cuts = sorted({c for t, _ in layout for c in t.bounds})
    # per block, the owning stage of each template (bisection on its cuts: a few dozen blocks,
    # too few for numpy to pay)
    stage = [[bisect.bisect_right(t.bounds, c) - 1 for c in cuts[:-1]] for t, _ in layout]
    buckets: dict[tuple[int, ...], list[float]] = {}  # owners -> [params, last block start]
    pools = ctx.problem.pools
    tps = [[pools[k].tp for k in t.stage_keys] for t, _ in layout]
    any_tp = any(x != 1 for row in tps for x in row)
    for (a, b), owners in zip(itertools.pairwise(cuts), zip(*stage)):
        entry = buckets.setdefault(owners, [0.0, 0])
        # each TP rank syncs its shard: the owner of least degree sets the bucket's size
        tp = min(x[s] for x, s in zip(tps, owners)) if any_tp else 1
        entry[0] += ctx.params.synced(a, b, tp)
        entry[1] = a
    # As `hetpp.specs.plan.grad_buckets`: latest layers first; then the tied bucket. Sharded
    # (the search's `optimizer_shards`): a reduce-scatter each, an all-gather after the step.
    grad, sharded = train.grad_bytes_per_param, ctx.problem.optimizer_shards > 1
    ring = ring_pass_time_s if sharded else allreduce_time_s
    ordered = sorted(buckets.items(), key=lambda kv: -kv[1][1])
    links = [_bucket_link(ctx, layout, owners, link) for owners, _ in ordered]
    order = [
        (tuple(enumerate(owners)), ring(params * grad, replicas, bucket_link))
        for (owners, (params, _)), bucket_link in zip(ordered, links)
    ]
    gathers = [
        (tuple(enumerate(owners)), ring_pass_time_s(params * train.dtype_bytes, replicas, lk))
        for (owners, (params, _)), lk in zip(ordered, links)
        if sharded
    ]
    order += _tied(ctx, layout, link)
    _, free = run_buckets(order, done)
    opt = {(i, s): x for i, (t, _) in enumerate(layout) for s, x in enumerate(t.opt_s)}
    return step_end_s(free, dict.fromkeys(free, 0.0), opt, gathers)


def _tied(ctx: ShapeContext, layout, link: Link) -> list[tuple[list[Group], float]]:
    """Tied embedding/head: first and last stages of every pipeline also sum that matrix."""
    extra = tied_copy_params(ctx.cm.model)
    if extra == 0 or all(t.num_stages == 1 for t, _ in layout):
        return []
    holders = {(i, 0) for i in range(len(layout))} | {
        (i, t.num_stages - 1) for i, (t, _) in enumerate(layout)
    }
    count = sum(n * (1 if t.num_stages == 1 else 2) for t, n in layout)
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


def _bucket_link(ctx: ShapeContext, layout, owners: tuple[int, ...], whole: Link) -> Link:
    """One bucket's ring: its owners' types decide (mixed pipelines whose stages of one type
    share a node sync those stages inside it); `whole` when they span types."""
    keys = {t.stage_keys[s] for (t, _), s in zip(layout, owners)}
    return _sync_link(ctx, layout, keys) if len(keys) == 1 else whole
