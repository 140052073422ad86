"""Layouts: how many pipelines of which template to build, chosen by capacity at a target time.

For a target time T, each template can run `cap(T)` micro-batches (0 if fewer than its minimum),
and a layout is feasible when its pipelines' capacities add up to the batch. The least feasible T
is found by a fixpoint: take the layout of largest capacity at T, compute its exact balanced time
T' <= T, and ask again just below T'; when nothing reaches the batch there, T' is optimal.

Two solvers answer "largest capacity at T":
- `CountDP`, exact over every multiset of templates: a dynamic program over device-count vectors
  (one entry per GPU type). Affordable for small clusters only.
- `TypeKnapsack`, for any size: fixed pipelines (a mixed template times k) plus, per GPU type,
  an unbounded knapsack over homogeneous depths (weight = devices, value = capacity), solved
  for all budgets at once with a running maximum per residue class (numpy).
Under 1F1B every pipeline needs at least S micro-batches, so the devices in use cannot exceed
the number of micro-batches: both solvers respect that budget.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from hetpp.planner.balance import balanced_time, capacities
from hetpp.planner.shapes import TemplateCost, template_arrays

Layout = list[tuple[TemplateCost, int]]
"""Templates with how many pipelines of each."""
Solver = Callable[[float], tuple[float, Layout]]


def layout_time(layout: Layout, total: int, use_tail: bool) -> float:
    """Least max pipeline time of a layout (inf if it cannot take the batch)."""
    if not layout:
        return float("inf")
    a = template_arrays([t for t, _ in layout])
    count = np.array([n for _, n in layout], dtype=float)
    tail = a["tail"] if use_tail else 0.0
    return balanced_time(a["fill"], a["beat"], a["lo"], a["hi"], count, total, tail)


def min_time(solve: Solver, total: int, use_tail: bool, max_rounds: int = 50):
    """(T, layout) with the least T whose best layout takes the batch; None if none does."""
    cap, layout = solve(1e30)
    if cap < total:
        return None
    t = layout_time(layout, total, use_tail)
    for _ in range(max_rounds):
        # Just below t, but past the float slack of `capacities` (layouts within a millionth
        # of t count as ties).
        cap, better = solve(t * (1 - 1e-6))
        if cap < total:
            break
        t2 = layout_time(better, total, use_tail)
        if not t2 < t:
            break
        t, layout = t2, better
    return t, layout


def _values(a: dict[str, np.ndarray], t: float, total: int, use_tail: bool) -> np.ndarray:
    """Capacity at time t of each template (columns from `template_arrays`), at most the
    batch (no pipeline needs more)."""
    tail = a["tail"] if use_tail else 0.0
    return capacities(t, a["fill"], a["beat"], a["lo"], np.minimum(a["hi"], total), tail)


class TypeKnapsack:
    """Fixed pipelines plus the best homogeneous pipelines per GPU type at a target time."""

    def __init__(
        self,
        items: dict[str, list[TemplateCost]],
        available: dict[str, int],
        fixed: Layout,
        total: int,
        use_tail: bool,
        device_budget: bool,
        single_depth: bool = False,
    ):
        self.items = {k: v for k, v in items.items() if v and available.get(k, 0) > 0}
        self.arrays = {k: template_arrays(v) for k, v in self.items.items()}
        # One depth per type: fewer distinct stage boundaries, so fewer gradient buckets.
        self.single_depth = single_depth
        self.available = available
        self.fixed = fixed
        self.fixed_arrays = template_arrays([t for t, _ in fixed]) if fixed else None
        self.total = total
        self.use_tail = use_tail
        used = sum(t.num_stages * n for t, n in fixed)
        self.budget = total - used if device_budget else 1 << 40

    def __call__(self, t: float) -> tuple[float, Layout]:
        """Largest capacity at time t, and the layout that has it."""
        base = 0.0
        if self.fixed_arrays is not None:
            vals = _values(self.fixed_arrays, t, self.total, self.use_tail)
            if (vals <= 0).any() or self.budget < 0:
                return -1.0, []
            base = float(sum(v * n for v, (_, n) in zip(vals, self.fixed)))
        tables, keys = [], list(self.items)
        for k in keys:
            vals = _values(self.arrays[k], t, self.total, self.use_tail)
            weights = [x.num_stages for x in self.items[k]]
            cap = max(0, min(self.available[k], self.budget))
            solve = _single if self.single_depth else _unbounded
            tables.append(solve(weights, vals, cap))
        spend = _split_budget([f for f, _ in tables], self.budget)
        layout = list(self.fixed)
        value = base
        for k, (f, copies), w in zip(keys, tables, spend):
            value += float(f[w])
            for item, n in zip(self.items[k], _backtrack(copies, self.items[k], w)):
                if n:
                    layout.append((item, n))
        return value, layout


def _unbounded(weights: list[int], values: np.ndarray, capacity: int):
    """f[w] = best total value with total weight <= w (any item any number of times), and per
    item the copies taken at each w, for backtracking. Per item, along each residue class of
    w mod weight, f_new[j] = j v + max_{i<=j} (f_old[i] - i v): a running maximum."""
    f = np.zeros(capacity + 1)
    copies = []
    for d, v in zip(weights, values):
        if v <= 0 or d > capacity:
            copies.append(None)
            continue
        rows = -(-(capacity + 1) // d)
        grid = np.full(rows * d, -np.inf)
        grid[: capacity + 1] = f
        j = np.arange(rows)[:, None]
        y = grid.reshape(rows, d) - j * v
        run = np.maximum.accumulate(y, axis=0)
        last = np.maximum.accumulate(np.where(y == run, j, -1), axis=0)
        f = (run + j * v).ravel()[: capacity + 1]
        copies.append((j - last).ravel()[: capacity + 1])
    return f, copies


def _single(weights: list[int], values: np.ndarray, capacity: int):
    """As `_unbounded`, but all pipelines of a type share one depth: f[w] = max_d (w // d) v_d."""
    w = np.arange(capacity + 1)
    per = np.array([(w // d) * max(v, 0.0) for d, v in zip(weights, values)])
    if not len(per):
        return np.zeros(capacity + 1), [None] * len(weights)
    pick = per.argmax(axis=0)
    f = per.max(axis=0)
    copies = [
        np.where(pick == q, w // d, 0) if v > 0 else None
        for q, (d, v) in enumerate(zip(weights, values))
    ]
    return f, copies


def _backtrack(copies, items: list[TemplateCost], w: int) -> list[int]:
    out = [0] * len(items)
    for q in reversed(range(len(items))):
        if copies[q] is None:
            continue
        n = int(copies[q][w])
        out[q] = n
        w -= n * items[q].num_stages
    return out


def _split_budget(fs: list[np.ndarray], budget: int) -> list[int]:
    """Devices each type may use so that the sum of best values is largest and the total is
    within `budget`: max-plus combination of the per-type value curves (only when binding)."""
    if sum(len(f) - 1 for f in fs) <= budget:
        return [len(f) - 1 for f in fs]
    acc = np.zeros(budget + 1)
    choice = []
    for f in fs:
        best = np.full(budget + 1, -np.inf)
        arg = np.zeros(budget + 1, dtype=int)
        for x in range(min(len(f), budget + 1)):
            cand = np.full(budget + 1, -np.inf)
            cand[x:] = acc[: budget + 1 - x] + f[x]
            better = cand > best
            best[better] = cand[better]
            arg[better] = x
        acc = best
        choice.append(arg)
    w = int(np.argmax(acc))
    out = []
    for arg in reversed(choice):
        out.append(int(arg[w]))
        w -= out[-1]
    return list(reversed(out))


class CountDP:
    """Exact: the best multiset of templates over device-count vectors (small clusters). A
    state depends only on states with fewer devices, so the states of one device count are
    solved together (one array step per count, not one per state)."""

    def __init__(
        self,
        templates: list[tuple[tuple[int, ...], TemplateCost]],
        counts: tuple[int, ...],
        total: int,
        device_budget: bool,
    ):
        self.templates = [t for _, t in templates]
        self.arrays = template_arrays(self.templates)
        self.total = total
        radix = np.cumprod([1, *[n + 1 for n in counts[:-1]]])
        states = [s[::-1] for s in itertools.product(*[range(n + 1) for n in reversed(counts)])]
        grid = np.array(states, dtype=int).reshape(len(states), len(counts))  # flat index order
        comps = np.array([c for c, _ in templates], dtype=int).reshape(len(templates), -1)
        fits = (comps[None, :, :] <= grid[:, None, :]).all(axis=2)  # state x template
        flat, comp_flat = grid @ radix, comps @ radix
        # Predecessor of each state by each template; one past the last state where it does
        # not fit (that entry of the value table stays -inf).
        pred = np.where(fits, flat[:, None] - comp_flat[None, :], len(states))
        size = grid.sum(axis=1)
        # The states numbered by device count (flat order within one): each count's states
        # are one slice of the tables, which its step reads without a gather. `rank` maps a
        # flat index to its number (the answer is the first best in flat order).
        order = np.argsort(size, kind="stable")
        rank = np.empty(len(states) + 1, dtype=int)
        rank[order], rank[-1] = np.arange(len(states)), len(states)
        self.pred = rank[pred[order]]
        self.rank = rank[:-1]
        ends = np.searchsorted(size[order], np.arange(1, int(size.max()) + 2))
        self.levels = list(itertools.pairwise(ends.tolist()))  # [start, end) per count 1, 2, ..
        self.rows = np.arange(max((b - a for a, b in self.levels), default=0))
        allowed = size <= total if device_budget else np.ones(len(size), dtype=bool)
        self.allowed = allowed[order]

    def __call__(
        self, t: float, use_tail: bool = False, mask: np.ndarray | None = None
    ) -> tuple[float, Layout]:
        """Largest capacity at time t over multisets of the templates (those `mask` allows)."""
        vals = _values(self.arrays, t, self.total, use_tail)
        ok = vals > 0 if mask is None else (vals > 0) & mask
        vals = np.where(ok, vals, -np.inf)
        g = np.full(len(self.pred) + 1, -np.inf)
        g[0] = 0.0
        arg = np.zeros(len(self.pred), dtype=int)
        for a, b in self.levels:
            cand = g[self.pred[a:b]] + vals
            best = arg[a:b] = np.argmax(cand, axis=1)
            g[a:b] = cand[self.rows[: b - a], best]
        g_ok = np.where(self.allowed, g[:-1], -np.inf)
        i = int(self.rank[np.argmax(g_ok[self.rank])])
        value = float(g_ok[i])
        counts: dict[int, int] = {}
        while i > 0:
            k = int(arg[i])
            counts[k] = counts.get(k, 0) + 1
            i = int(self.pred[i, k])
        return value, [(self.templates[k], n) for k, n in sorted(counts.items())]
