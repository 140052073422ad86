"""What a layout pays after its pipelines: block-wise gradient sync and the optimizer step.

The same rules as `hetpp.cost.step`, at template granularity, so the search can rank layouts
without placing them: the layer list is cut at every template's stage boundaries; each block is
all-reduced over one owner per pipeline; blocks with the same owners form one bucket; buckets run
latest layers first, each when its owners are done with backward and free of earlier ones. Mixing
templates with different boundaries makes more buckets that chain through shared owners: that is
the price of heterogeneous splits the search must see.
"""

from __future__ import annotations

import itertools

import numpy as np

from hetpp.cost.comm import allreduce_time_s
from hetpp.planner.shapes import ShapeContext, TemplateCost
from hetpp.specs.cluster import Link


def layout_tail(ctx: ShapeContext, layout: list[tuple[TemplateCost, int]]) -> float:
    """Seconds from the end of the slowest pipeline to the end of the step (sync + optimizer),
    assuming every pipeline ends together (data balance makes them nearly so)."""
    train = ctx.cm.train
    replicas = sum(n for _, n in layout)
    link = _sync_link(ctx, layout)
    # Each (template, stage) stands for its `count` owners; done = end - lag behind the end.
    done: dict[tuple[int, int], float] = {}
    for i, (t, _) in enumerate(layout):
        lag = 0.0
        for s in range(t.num_stages):
            done[(i, s)] = -lag
            lag += t.bwd_s[s] + (t.comm_s[s] if s < len(t.comm_s) else 0.0)
    cuts = sorted({c for t, _ in layout for c in t.bounds})
    stage = [np.searchsorted(t.bounds, cuts[:-1], side="right") - 1 for t, _ in layout]
    buckets: dict[tuple[int, ...], list[float]] = {}  # owners -> [params, last block start]
    for j, (a, b) in enumerate(itertools.pairwise(cuts)):
        owners = tuple(int(x[j]) for x in stage)
        entry = buckets.setdefault(owners, [0.0, 0])
        entry[0] += ctx.grads_between(a, b)
        entry[1] = a
    free = dict(done)
    # As `hetpp.specs.plan.grad_buckets`: latest layers first.
    for owners, (params, _) in sorted(buckets.items(), key=lambda kv: -kv[1][1]):
        keys = [(i, s) for i, s in enumerate(owners)]
        start = max(max(done[k] for k in keys), max(free[k] for k in keys))
        end = start + allreduce_time_s(params * train.grad_bytes_per_param, replicas, link)
        for k in keys:
            free[k] = end
    _tied(ctx, layout, free, link)
    last = 0.0
    for i, (t, _) in enumerate(layout):
        for s, (a, b) in enumerate(itertools.pairwise(t.bounds)):
            bw = ctx.problem.pools[t.stage_keys[s]].gpu.mem_bw_bytes_per_s
            opt = 2 * ctx.params_between(a, b) * train.state_bytes_per_param / bw
            last = max(last, max(free[(i, s)], 0.0) + opt)
    return last


def _tied(ctx: ShapeContext, layout, free: dict, link: Link) -> None:
    """Tied embedding/head: first and last stages of every pipeline also sum that matrix."""
    last = ctx.cm.model.layers[-1]
    extra = last.stored_params - last.params
    if extra == 0 or all(t.num_stages == 1 for t, _ in layout):
        return
    holders = {(i, 0) for i in range(len(layout))} | {
        (i, t.num_stages - 1) for i, (t, _) in enumerate(layout)
    }
    count = sum(n * (1 if t.num_stages == 1 else 2) for t, n in layout)
    start = max(free[h] for h in holders)
    end = start + allreduce_time_s(extra * ctx.cm.train.grad_bytes_per_param, count, link)
    for h in holders:
        free[h] = end


def _sync_link(ctx: ShapeContext, layout) -> Link:
    """As `Cluster.group_link`: peers on several nodes run at the slower of the network and
    their nodes' fabric; all on one node, at that node's fabric."""
    cl, pools = ctx.problem.cluster, ctx.problem.pools
    keys = {k for t, _ in layout for k in t.stage_keys}
    intra = min(pools[k].intra_bw_bytes_per_s for k in keys)
    used = {k: sum(n * c for t, n in layout for kk, c in t.runs if kk == k) for k in keys}
    one_node = len(keys) == 1 and all(used[k] <= pools[k].gpus_per_node for k in keys)
    if one_node or ctx.problem.num_nodes == 1:
        return Link(intra, cl.intra_node_latency_us * 1e-6)
    return Link(min(cl.inter_node_GBps * 1e9, intra), cl.inter_node_latency_us * 1e-6)
