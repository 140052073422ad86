"""Baselines in the same tool: same cost model, same plan format, same final ranking.

- `uniform` (Megatron-style): identical pipelines over the devices in id order (stage s of
  pipeline p on device s*P + p), equal layers per stage, equal batch per pipeline.
- `layer-balanced` (Metis/AMP-style): identical mixed-type pipelines (each takes N_t/P devices
  of every type), layers split by speed and memory, equal batch.
- `data-balanced` (Whale/Oobleck-style): one GPU type per pipeline, one depth per type, equal
  layers per stage, batch shares balanced across pipelines.
Each searches its own knobs (depth or pipeline count, micro-batch size, recomputation) by the
closed form and ranks its best few with the full cost, like `hpp`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from hetpp.planner.assemble import (
    Draft,
    Pipe,
    PlanResult,
    best_candidate,
    layout_pipes,
    pipe_group,
    pipe_signature,
)
from hetpp.planner.balance import capacities
from hetpp.planner.bounds import ideal_time_bound
from hetpp.planner.layout import Layout, min_time
from hetpp.planner.partition import equal_bounds
from hetpp.planner.problem import Problem
from hetpp.planner.schedules import Split, choose_schedules
from hetpp.planner.shapes import ShapeContext, Workspace, run_lengths, template_arrays


def uniform(problem: Problem, ws: Workspace | None = None) -> PlanResult:
    """Identical pipelines in device-id order, equal layers, equal batch."""
    t0 = time.perf_counter()
    ws = ws or Workspace(problem)
    units, layers = problem.units, problem.layer_list_len
    n = len(units)
    cands: list[Draft] = []
    for rc, mbs in _settings(problem, ws):
        if cands and ideal_time_bound(problem, rc, mbs) >= min(c.estimate_s for c in cands):
            continue
        ctx = ws.context(rc, mbs)
        total = problem.micro_batches(mbs)
        fitting = 0
        for depth in range(1, min(n, layers) + 1):
            lo = problem.schedule_spec.min_micro_batches(depth)
            p = next((p for p in range(n // depth, 0, -1) if total % p == 0), 0)
            if not p or total // p < lo:
                continue
            bounds = equal_bounds(layers, depth)
            pipes = [Pipe(tuple(units[s * p + q] for s in range(depth)), bounds) for q in range(p)]
            est = _equal_batch_time(ctx, pipes, total // p)
            if est is not None:
                cands.append(Draft(est, rc, mbs, pipes, [total // p] * p))
                fitting += 1
            if fitting > DEPTHS:
                break  # deeper: more bubbles for less gradient sync; a few are enough
    return _result(problem, "uniform", cands, t0, ws)


def layer_balanced(problem: Problem, ws: Workspace | None = None) -> PlanResult:
    """P identical mixed pipelines of N_t // P devices of each type, DP split, equal batch."""
    t0 = time.perf_counter()
    ws = ws or Workspace(problem)
    cands: list[Draft] = []
    for rc, mbs in _settings(problem, ws):
        if cands and ideal_time_bound(problem, rc, mbs) >= min(c.estimate_s for c in cands):
            continue
        ctx = ws.context(rc, mbs)
        total = problem.micro_batches(mbs)
        for p in range(1, problem.cluster.num_devices + 1):
            comp = tuple(c // p for c in ctx.counts)
            depth = sum(comp)
            if depth == 0:
                break
            lo = problem.schedule_spec.min_micro_batches(depth)
            if total % p or total // p < lo or depth > problem.layer_list_len:
                continue
            tmpl = ctx.best(comp)
            if tmpl is None:
                continue
            pipes = layout_pipes(problem, [(tmpl, p)])
            est = _equal_batch_time(ctx, pipes, total // p) if pipes else None
            if est is not None:
                cands.append(Draft(est, rc, mbs, pipes, [total // p] * p))
    return _result(problem, "layer-balanced", cands, t0, ws)


def data_balanced(problem: Problem, ws: Workspace | None = None) -> PlanResult:
    """Homogeneous pipelines, one depth per GPU type, equal layers, balanced batch shares."""
    t0 = time.perf_counter()
    ws = ws or Workspace(problem)
    cands: list[Draft] = []
    for rc, mbs in _settings(problem, ws):
        # As the other baselines: a setting whose optimistic bound cannot beat the best
        # estimate so far is skipped (building every depth of every type is its whole cost).
        if cands and ideal_time_bound(problem, rc, mbs) >= min(c.estimate_s for c in cands):
            continue
        ctx = ws.context(rc, mbs)
        total = problem.micro_batches(mbs)
        items = {}
        for key, count in zip(ctx.keys, ctx.counts):
            depths = range(1, min(count, problem.layer_list_len) + 1)
            found = [
                ctx.with_bounds(((key, d),), equal_bounds(problem.layer_list_len, d))
                for d in depths
            ]
            items[key] = (count, [t for t in found if t is not None])
        budget = problem.schedule_spec.devices_within_batch
        got = min_time(_one_depth_per_type(items, total, budget), total, use_tail=False)
        if got is None:
            continue
        t, layout = got
        pipes = layout_pipes(problem, layout)
        if pipes:
            cands.append(Draft(t + max(x.tail_s for x, _ in layout), rc, mbs, pipes))
    return _result(problem, "data-balanced", cands, t0, ws)


def _settings(problem: Problem, ws: Workspace) -> list[tuple[bool, int]]:
    """Settings in order of their optimistic bound (skipped once it exceeds the best found)."""
    return sorted(ws.settings(), key=lambda s: ideal_time_bound(problem, *s))


def _one_depth_per_type(
    items, total: int, device_budget: bool
) -> Callable[[float], tuple[float, Layout]]:
    """Solver for `min_time`: each type builds as many pipelines as it can of the one depth that
    runs the most micro-batches by time t (with `device_budget`, devices in use capped by the
    micro-batches of the batch)."""

    # Each type's columns and pipeline counts, read once for every t the solver is asked.
    types = [
        (ts, template_arrays(ts), np.array([count // x.num_stages for x in ts]))
        for count, ts in items.values()
        if ts
    ]

    def solve(t: float) -> tuple[float, Layout]:
        value, layout, used = 0.0, [], 0
        for templates, a, n in types:
            caps = capacities(t, a["fill"], a["beat"], a["lo"], np.minimum(a["hi"], total))
            best = int(np.argmax(caps * n))
            if caps[best] > 0:
                value += float(caps[best] * n[best])
                layout.append((templates[best], int(n[best])))
                used += int(n[best]) * templates[best].num_stages
        if device_budget and used > total:
            return -1.0, []
        return value, layout

    return solve


def _equal_batch_time(ctx: ShapeContext, pipes: list[Pipe], m: int) -> float | None:
    """Slowest pipeline with m micro-batches each (None if any does not fit memory)."""
    problem = ctx.problem
    seen: dict[tuple, float] = {}
    worst = 0.0
    for pipe in pipes:
        sig = pipe_signature(problem, pipe)
        if sig not in seen:
            runs = run_lengths(sig[0])
            tmpl = ctx.with_bounds(runs, pipe.bounds) if runs else None
            if tmpl is None:
                return None
            kind = pipe_group(problem, ctx.recompute, ctx.mbs, pipe)
            if not kind.lo <= m <= kind.hi:
                return None
            seen[sig] = kind.time(m) + tmpl.tail_s
        worst = max(worst, seen[sig])
    return worst


def _result(
    problem: Problem, strategy: str, cands: list[Draft], t0: float, ws: Workspace
) -> PlanResult:
    best = best_candidate(problem, cands, strategy)
    if best is None:
        elapsed = time.perf_counter() - t0
        return PlanResult(strategy, None, None, elapsed, "no plan of this kind fits")
    plan, step = best
    if ws.schedule_pass:
        plan, step = choose_schedules(problem, plan, *SCHEDULE_FREEDOM[strategy])
    return PlanResult(strategy, plan, step, time.perf_counter() - t0)


SCHEDULE_FREEDOM: dict[str, tuple[Split, bool]] = {
    "uniform": ("equal", False),
    "layer-balanced": ("balanced", False),
    "data-balanced": ("equal", True),
}
"""How each baseline may re-split and re-balance a pipeline it moves to a multi-chunk schedule
(`hetpp.planner.schedules`): its own kind of layer split and batch shares."""


DEPTHS = 6
"""Baselines try this many memory-feasible depths past the first (deeper ones only add bubbles
in exchange for less gradient sync)."""

BASELINES: dict[str, Callable[..., PlanResult]] = {
    "uniform": uniform,
    "layer-balanced": layer_balanced,
    "data-balanced": data_balanced,
}
"""Baseline strategies by name."""
