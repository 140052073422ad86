"""Data balance: integer micro-batch counts per pipeline that minimize the slowest pipeline.

A pipeline of kind k running m micro-batches takes `tail + fill + (m - 1) * beat` seconds (the
closed 1F1B/GPipe form of `hetpp.cost.pipeline.pipeline_time_s`: `fill` is one traversal of
all stages, `beat` the slowest stage's time per micro-batch; `tail` is an optional fixed extra
such as estimated gradient sync) and needs `lo <= m <= hi` (1F1B needs m >= stages; GPipe is
capped by memory). Times are monotone in m, so the least achievable maximum is the least T at
which the pipelines' capacities `max {m : time(m) <= T}` add up to the total: a bisection on T,
vectorized over groups (and over many pipeline sets at once for the oracle). The counts are then
the capacities at that T, trimmed where they overshoot.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetpp.cost.pipeline import micro_batches_within, steady_time_s

BISECTION_STEPS = 64


@dataclass(frozen=True)
class PipelineGroup:
    """Identical pipelines: their time per micro-batch count, bounds and how many there are."""

    fill_s: float
    beat_s: float
    lo: int
    hi: int
    count: int = 1
    tail_s: float = 0.0

    def time(self, m: int) -> float:
        return steady_time_s(self.tail_s + self.fill_s, self.beat_s, m)


def capacities(
    t: np.ndarray,
    fill: np.ndarray,
    beat: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    tail: np.ndarray | float = 0.0,
) -> np.ndarray:
    """Most micro-batches each kind can run by time `t` (broadcast), 0 where fewer than `lo`."""
    m = micro_batches_within(t - tail, fill, beat)
    m = np.minimum(m, hi)
    return np.where(m >= lo, m, 0.0)


def _reaches_total(cap: np.ndarray, lo: np.ndarray, count: np.ndarray, total: int) -> np.ndarray:
    """Rows whose pipelines (count > 0) all reach their minimum and together the total."""
    used = count > 0
    reach = np.where(used, cap >= lo, True).all(axis=-1)
    return reach & ((cap * count).sum(axis=-1) >= total)


def balanced_times(
    fill: np.ndarray,
    beat: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    count: np.ndarray,
    total: int,
    tail: np.ndarray | float = 0.0,
) -> np.ndarray:
    """Least achievable max pipeline time for each row of (rows, groups) arrays (inf where the
    total cannot be placed: too many pipelines for it, or too little room). `count` 0 pads."""
    fill, beat, lo, hi, count = (
        np.atleast_2d(np.asarray(x, dtype=float)) for x in (fill, beat, lo, hi, count)
    )
    base = np.broadcast_to(np.asarray(tail, dtype=float), fill.shape) + fill
    used = count > 0
    ok = ((count * lo).sum(axis=1) <= total) & ((count * hi).sum(axis=1) >= total)
    ok &= np.where(used, hi >= lo, True).all(axis=1)
    start = np.where(used, steady_time_s(base, beat, lo), 0.0).max(axis=1)
    if not ok.any():
        return np.full(len(fill), np.inf)
    # Every pipeline at its minimum may already cover the total; else bisect up from there.
    done = ok & _reaches_total(capacities(start[:, None], base, beat, lo, hi), lo, count, total)
    left = start.copy()
    right = start + total * np.where(used, beat, 0.0).max(axis=1) + 1e-9
    for _ in range(BISECTION_STEPS):
        mid = (left + right) / 2
        enough = _reaches_total(capacities(mid[:, None], base, beat, lo, hi), lo, count, total)
        right = np.where(enough, mid, right)
        left = np.where(enough, left, mid)
    return np.where(ok, np.where(done, start, right), np.inf)


def balanced_time(
    fill: np.ndarray,
    beat: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    count: np.ndarray,
    total: int,
    tail: np.ndarray | float = 0.0,
) -> float:
    """`balanced_times` for one set of groups, exactly and fast: bracket T between the
    continuous solution (a lower bound: floors only lose capacity) and a feasible point, then
    binary-search the few step times `tail + fill + (m - 1) beat` inside the bracket."""
    fill, beat, lo, hi, count = (np.asarray(x, dtype=float) for x in (fill, beat, lo, hi, count))
    base = np.broadcast_to(np.asarray(tail, dtype=float), fill.shape) + fill
    keep = count > 0
    base, beat, lo, hi, count = (x[keep] for x in (base, beat, lo, hi, count))
    if not keep.any() or (count * lo).sum() > total or (count * hi).sum() < total:
        return float("inf")
    if (hi < lo).any():
        return float("inf")

    def enough(t: float) -> bool:
        return bool(_reaches_total(capacities(t, base, beat, lo, hi), lo, count, total))

    start = float(steady_time_s(base, beat, lo).max())
    if enough(start):
        return start
    cont = (total - count.sum() + (count * base / beat).sum()) / (count / beat).sum()
    left = max(start, float(cont)) * (1 - 1e-12)  # the continuous point may be a step itself
    step = float(beat.max())
    for _ in range(200):
        if enough(left + step):
            break
        step *= 2
    right = left + step
    first = np.floor((left - base) / beat) + 2  # first count whose time exceeds `left`
    last = np.minimum(np.floor((right - base) / beat) + 1, hi)
    if (last - first).clip(0).sum() > 4096:  # a wide bracket: plain bisection
        return float(balanced_times(base, beat, lo, hi, count, total)[0])
    steps = [
        steady_time_s(b, bt, np.arange(f, e + 1)) for b, bt, f, e in zip(base, beat, first, last)
    ]
    times = np.unique(np.concatenate(steps))
    times = times[(times > left) & (times <= right)]
    if not len(times):
        return right
    # `enough` is monotone in t: the first step time that is enough, all checked at once
    # (what a binary search over them finds; capacities are whole numbers, so their sums are
    # exact in any order)
    ok = _reaches_total(capacities(times[:, None], base, beat, lo, hi), lo, count, total)
    return float(times[np.argmax(ok)]) if ok.any() else right


def allocate(groups: Sequence[PipelineGroup], total: int) -> tuple[float, list[list[int]]] | None:
    """Micro-batch counts per pipeline (one list per kind) summing to `total` with the least
    possible slowest pipeline, and that time; None if no allocation exists."""
    arr = {
        k: np.array([getattr(x, k) for x in groups], dtype=float)
        for k in ("fill_s", "beat_s", "lo", "hi", "count", "tail_s")
    }
    t = balanced_time(
        arr["fill_s"], arr["beat_s"], arr["lo"], arr["hi"], arr["count"], total, arr["tail_s"]
    )
    if not np.isfinite(t):
        return None
    cap = capacities(t, arr["fill_s"], arr["beat_s"], arr["lo"], arr["hi"], arr["tail_s"])
    counts = [[int(c)] * k.count for c, k in zip(cap, groups)]
    excess = sum(map(sum, counts)) - total
    # Take the overshoot from the pipelines that finish last: each loses at most one
    # micro-batch (at the least T, fewer than all pipelines overshoot), never below its minimum.
    order = sorted(
        ((k.time(c[0]), i) for i, (k, c) in enumerate(zip(groups, counts))), reverse=True
    )
    for _, i in order:
        for j in range(len(counts[i])):
            if excess == 0:
                break
            if counts[i][j] > groups[i].lo:
                counts[i][j] -= 1
                excess -= 1
    if excess:
        return _greedy_allocate(groups, total)
    worst = max(k.time(m) for k, ms in zip(groups, counts) for m in ms)
    return worst, counts


def _greedy_allocate(
    groups: Sequence[PipelineGroup], total: int
) -> tuple[float, list[list[int]]] | None:
    """Water-filling fallback: start every pipeline at its minimum, then give each further
    micro-batch to the pipeline that would finish earliest with it (exact for monotone times)."""
    counts = [[k.lo] * k.count for k in groups]
    left = total - sum(map(sum, counts))
    if left < 0:
        return None
    heap = [(k.time(k.lo + 1), i, j) for i, k in enumerate(groups) for j in range(k.count)]
    heapq.heapify(heap)
    while left:
        if not heap:
            return None
        _, i, j = heapq.heappop(heap)
        if counts[i][j] >= groups[i].hi:
            continue
        counts[i][j] += 1
        left -= 1
        heapq.heappush(heap, (groups[i].time(counts[i][j] + 1), i, j))
    worst = max(k.time(m) for k, ms in zip(groups, counts) for m in ms)
    return worst, counts
