"""Branch and bound over multisets of templates (small clusters; the oracle and hpp's exact path).

Every multiset of templates that fits the cluster's device counts is a candidate layout. Its
full step cost is at least (a) its balanced closed-form time at the best links (the slowest
pipeline ends no earlier), plus (b) what must follow the slowest pipeline: its own optimizer
step, and, with two or more pipelines, the all-reduce of all of its first stage's gradients
(that device is done only when its pipeline ends, and its buckets run one after another over
one owner per pipeline; fastest link assumed) and then that device's optimizer step.
Candidates are visited in order of that bound; the walk stops when it reaches the best full
cost found.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from hetpp.cost.comm import allreduce_time_s, fastest_link
from hetpp.cost.sync import optimizer_step_s, state_bytes
from hetpp.planner.balance import balanced_times
from hetpp.planner.shapes import ShapeContext, TemplateCost, run_lengths, template_arrays

Multiset = tuple[tuple[int, int], ...]
"""((template index, copies), ...)."""


def compositions(ctx: ShapeContext):
    """Every device-count vector a pipeline can have (at most one device per layer)."""
    layers = ctx.layer_list_len
    ranges = [range(min(n, layers) + 1) for n in ctx.counts]
    for comp in itertools.product(*ranges):
        if 0 < sum(comp) <= layers:
            yield comp


def count_multisets(comps: list[tuple[int, ...]], counts: tuple[int, ...]) -> int:
    """How many non-empty multisets of these compositions fit: the number of ways to fill
    each device-count vector (unbounded coin-change over vectors), summed."""
    shape = tuple(n + 1 for n in counts)
    ways = np.zeros(shape, dtype=float)
    ways[(0,) * len(shape)] = 1
    for c in comps:
        # ways[v] += ways[v - c] for v ascending (v - c already counts this coin): slabs of
        # c[i] along one axis i with c[i] > 0 depend only on the slabs below them.
        i = next(j for j, x in enumerate(c) if x)
        for lo in range(0, shape[i] - c[i], c[i]):
            hi = min(lo + c[i], shape[i] - c[i])
            ways[_slab(shape, c, i, lo, hi, c)] += ways[_slab(shape, c, i, lo, hi, None)]
    return int(ways.sum()) - 1


def _slab(shape, c, i, lo, hi, shift) -> tuple[slice, ...]:
    """Entries v whose v[i] - lo is in [0, hi - lo) and v - c is in the grid, offset by `shift`
    (the coin: the entries that receive) or not (the entries they add)."""
    out = []
    for j, (n, x) in enumerate(zip(shape, c)):
        off = shift[j] if shift else 0
        out.append(slice(lo + off, hi + off) if j == i else slice(off, n - x + off))
    return tuple(out)


def multisets(comps: list[tuple[int, ...]], counts: tuple[int, ...]) -> list[Multiset]:
    """Every non-empty multiset of templates (given by their compositions) that fits."""
    arr = np.array(comps, dtype=int).reshape(len(comps), len(counts))
    out: list[Multiset] = []

    def walk(start: int, left: np.ndarray, chosen: list[int]) -> None:
        fits = np.flatnonzero((arr[start:] <= left).all(axis=1)) + start
        for i in fits:
            chosen.append(int(i))
            out.append(run_lengths(chosen))
            walk(int(i), left - arr[i], chosen)
            chosen.pop()

    walk(0, np.array(counts), [])
    return out


def composition(ctx: ShapeContext, t: TemplateCost) -> tuple[int, ...]:
    c = [0] * len(ctx.keys)
    for k, n in t.runs:
        c[ctx.keys.index(k)] += n
    return tuple(c)


def lower_bounds(ctx: ShapeContext, templates: list[TemplateCost], sets: list[Multiset]):
    """A lower bound on the full step cost of every multiset (inf where infeasible)."""
    width = max(len(s) for s in sets)
    idx = np.zeros((len(sets), width), dtype=int)
    cnt = np.zeros((len(sets), width))
    for r, s in enumerate(sets):
        for j, (i, k) in enumerate(s):
            idx[r, j], cnt[r, j] = i, k
    a = template_arrays(templates)
    total = ctx.problem.micro_batches(ctx.mbs)
    t = balanced_times(a["fill"][idx], a["beat"][idx], a["lo"][idx], a["hi"][idx], cnt, total)
    opt_all, opt_first, grads_first = (
        np.array(x) for x in zip(*(_optimizer_and_first_sync(ctx, x) for x in templates))
    )
    used = cnt > 0
    own_opt = np.where(used, opt_all[idx], np.inf).min(axis=1)
    # Stage 0 of the slowest pipeline is done when that pipeline ends (>= t); then it
    # all-reduces all its gradients, bucket after bucket, each over one owner per pipeline.
    p = cnt.sum(axis=1, keepdims=True)
    nbytes = grads_first[idx] * ctx.cm.train.grad_bytes_per_param
    ring = allreduce_time_s(nbytes, p, fastest_link(ctx.problem.cluster))
    sync = np.where(used, ring + opt_first[idx], np.inf).min(axis=1)
    return t + np.where(p[:, 0] > 1, np.maximum(own_opt, sync), own_opt)


def _optimizer_and_first_sync(ctx: ShapeContext, t: TemplateCost) -> tuple[float, float, float]:
    """(largest optimizer step of a stage, that of stage 0, gradients stage 0 all-reduces)."""
    pools = ctx.problem.pools
    opts = [
        optimizer_step_s(
            state_bytes(ctx.params.stored(a, b, pools[k].tp), ctx.cm.train),
            pools[k].gpu.mem_bw_bytes_per_s,
        )
        for k, (a, b) in zip(t.stage_keys, itertools.pairwise(t.bounds))
    ]
    # a lower bound: the largest degree any type has shrinks the first stage's share the most
    most = max(p.tp for p in pools.values())
    return max(opts), opts[0], ctx.params.synced(0, t.bounds[1], most)


def branch_and_bound(
    ctx: ShapeContext,
    templates: list[TemplateCost],
    bound: Callable[[], float],
    evaluate: Callable[[list[tuple[TemplateCost, int]]], None],
) -> None:
    """Evaluate multisets in order of their lower bound while it is below `bound()`."""
    comps = [composition(ctx, t) for t in templates]
    sets = multisets(comps, ctx.counts)
    if not sets:
        return
    lbs = lower_bounds(ctx, templates, sets)
    for r in np.argsort(lbs, kind="stable"):
        if not lbs[r] < bound():
            break
        evaluate([(templates[i], k) for i, k in sets[r]])
