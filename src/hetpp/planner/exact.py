"""Exact reference search: hpp's plan space, with each pipeline's schedule inside the count DP.

`bench/search_quality.py` measures the default search against this. hpp's exact path
(`search._search_exact`) ranks layouts by their one-chunk cost and gives only the fastest few
the schedule pass, so a layout that is slower under 1F1B but faster once chunked escapes it.
Here every template (composition, stage order, its balanced one-chunk split) also enters the
count DP (`layout.CountDP`) once per multi-chunk schedule the problem allows
(`Problem.chunked_schedules`, at `schedules.CHUNK_COUNTS` chunks), as the schedule pass would
re-split it (`schedules._chunked`: loop placement keeps each device's layer count, V gives each
device its work), with that schedule's fill, beat, fewest micro-batches and memory cap. So the
DP's answer is the least compute time over every multiset of (template, schedule) that fits
the cluster, with real-valued-then-integer batch shares (`layout.min_time`), for every
micro-batch size and recomputation setting (the settings whose `bounds.ideal_time_bound` can
still win). As in the exact path, the answers are peeled by tail per subset of GPU types until
the compute time alone reaches the best full cost found (a lower bound: nothing later can win);
each answer is placed (`placement`), its pipelines moved to their schedules, batch shares
settled for torch and re-balanced, and ranked by the full step cost. Beside that, hpp's exact path
runs as hpp runs it (`search._search_exact` on every setting, the baselines, the schedule pass
on its best plans: `after_schedule_pass`), and the faster plan is kept, so this search is never
worse than that path.

What "exact" covers: the compute time (closed form at each template's best links, the first
line of each schedule's timing rule, as data balance reads it) of every multiset of templates
and schedules per setting. Not covered exactly: the full cost's sync and optimizer tail
(peeled by each template's estimated tail, as hpp's exact path does), placement on real links,
a chunked pipeline's memory cap (`_memory_cap`: at the template's representative placement),
per-stage recomputation dropped after the search (`recompute.drop_unneeded_recompute`), more
than `schedules.CHUNK_COUNTS` chunks, and the fully sharded family (`planner.fsdp`, which
`plan --strategy best` runs beside hpp, not here).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace

import numpy as np

from hetpp.cost.memory import device_memory, most_micro_batches, stage_memory
from hetpp.cost.step import StepCost, stage_layer_costs
from hetpp.planner.assemble import (
    PlanResult,
    build_plan,
    evaluate,
    layout_pipes,
)
from hetpp.planner.bounds import ideal_time_bound
from hetpp.planner.layout import CountDP, Layout
from hetpp.planner.oracle import seeded
from hetpp.planner.problem import Problem
from hetpp.planner.recompute import drop_unneeded_recompute
from hetpp.planner.schedules import (
    CHUNK_COUNTS,
    _chunked,
    _groups,
    _rebalanced,
    _settle,
    _with_pipeline,
    choose_schedules,
)
from hetpp.planner.search import (
    _all_templates,
    _peel,
    _search_exact,
    after_schedule_pass,
)
from hetpp.planner.shapes import UNBOUNDED, ShapeContext, TemplateCost
from hetpp.specs.plan import Plan
from hetpp.specs.schedule import SCHEDULES

Variant = tuple[TemplateCost, str | None, int]
"""A one-chunk template, the schedule its pipelines run (None: the problem's own) and chunks."""


def search_exact(problem: Problem) -> PlanResult:
    """The best plan of hpp's space over layouts and per-pipeline schedules (module docstring:
    what is exact and what is not). Slow: a benchmark reference, not a planner."""
    t0 = time.perf_counter()
    ws, inc, seeds = seeded(problem, "exact")
    found: list[PlanResult] = []  # chunked plans, costed in full

    def best_s() -> float:
        return min([inc.bound, *(r.iteration_time_s for r in found)])

    for rc, mbs in sorted(ws.settings(), key=lambda s: ideal_time_bound(problem, *s)):
        bound = ideal_time_bound(problem, rc, mbs)  # no plan of this setting beats it
        ctx = ws.context(rc, mbs)
        if bound < inc.bound:
            _search_exact(ctx, inc)  # hpp's exact path, as hpp runs it
        templates = _all_templates(ctx) if bound < best_s() else []
        if templates:
            _search_variants(ctx, templates, found, best_s)
    if inc.result is None and not found:
        return PlanResult("exact", None, None, time.perf_counter() - t0, "no plan fits")
    best = min(found, key=lambda r: r.iteration_time_s) if found else None
    if inc.result is not None:
        path = after_schedule_pass(problem, inc.results, seeds, list(inc.per_setting.values()))
        best = path if best is None or path.iteration_time_s <= best.iteration_time_s else best
    plan = best.plan.model_copy(update={"strategy": "exact"})
    return PlanResult("exact", plan, best.step, time.perf_counter() - t0)


def _search_variants(ctx: ShapeContext, templates, found, best_s) -> None:
    """The count DP over every (template, schedule) of one setting, peeled by tail per subset
    of GPU types (as `search._search_exact`); each answer built (`_build`) and kept in
    `found`."""
    problem = ctx.problem
    rows, meaning = variant_rows(ctx, templates)
    total = problem.micro_batches(ctx.mbs)
    dp = CountDP(rows, ctx.counts, total, problem.schedule_spec.devices_within_batch)
    index = {id(tc): i for i, (_, tc) in enumerate(rows)}
    comps = np.array([c for c, _ in rows]) > 0
    subsets = sorted(itertools.product((False, True), repeat=len(ctx.keys)), key=lambda q: -sum(q))

    def take(layout: Layout) -> None:
        got = _build(ctx, [(meaning[index[id(tc)]], n) for tc, n in layout])
        if got is not None:
            found.append(got)

    for q in subsets:
        if any(q):
            mask = ~(comps & ~np.array(q)).any(axis=1)
            _peel(ctx, dp, mask, best_s, take)


def variant_rows(
    ctx: ShapeContext, templates: list[tuple[tuple[int, ...], TemplateCost]]
) -> tuple[list[tuple[tuple[int, ...], TemplateCost]], list[Variant]]:
    """The count DP's rows, (composition, costed variant), for every template and schedule
    (`_variants`), and what each row is: (one-chunk template, schedule, chunks)."""
    rows: list[tuple[tuple[int, ...], TemplateCost]] = []
    meaning: list[Variant] = []
    for comp, t in templates:
        for v, name, chunks in _variants(ctx, t):
            rows.append((comp, v))
            meaning.append((t, name, chunks))
    return rows, meaning


def _variants(ctx: ShapeContext, t: TemplateCost) -> list[tuple[TemplateCost, str | None, int]]:
    """`t` as it is, and as each multi-chunk schedule would run it (fill, beat, fewest
    micro-batches and memory cap of the re-split pipeline at a representative placement)."""
    out: list[tuple[TemplateCost, str | None, int]] = [(t, None, 1)]
    problem = ctx.problem
    if not problem.chunked_schedules:
        return out
    pipes = layout_pipes(problem, [(t, 1)])
    total = problem.micro_batches(ctx.mbs)
    if pipes is None:
        return out
    plan = build_plan(problem, ctx.recompute, ctx.mbs, pipes, "exact", [total])
    if plan is None:
        return out
    for name in problem.chunked_schedules:
        spec = SCHEDULES[name]
        for chunks in CHUNK_COUNTS[spec.placement]:
            pipe = _chunked(problem, plan, plan.pipelines[0], spec, chunks, "balanced")
            if pipe is None:
                continue
            trial = _with_pipeline(plan, 0, pipe)
            groups = _groups(problem, trial)
            if groups is None:
                continue
            lo = next(
                (m for m in range(1, total + 1) if spec.micro_batch_problem(
                    len(pipe.stages), len(pipe.devices), m) is None),
                None,
            )  # fmt: skip
            hi = None if lo is None else _memory_cap(problem, trial, lo, total)
            if hi is None:
                continue
            g = groups[0]
            v = replace(t, fill_s=g.fill_s, beat_s=g.beat_s, lo=lo, hi=hi)
            out.append((v, name, chunks))
    return out


def _memory_cap(problem: Problem, plan: Plan, lo: int, total: int) -> int | None:
    """Most micro-batches the one-pipeline `plan` takes in memory (`UNBOUNDED` if the whole
    batch fits; None if not even `lo` does), each stage and each device (its stages together)
    as `cost.step` charges them."""
    cm = problem.cost_model(plan.train.recompute, shards=1)
    pipe = plan.pipelines[0]
    spec = pipe.schedule_in(plan.train)
    costs = [stage_layer_costs(cm, st, pipe.micro_batch_size) for st in pipe.stages]
    num, num_devices = len(pipe.stages), len(pipe.devices)

    def excess(m: int) -> float:
        """Bytes past capacity on the fullest stage or device (<= 0: it fits)."""
        by_device: dict[int, list] = {}
        worst = -math.inf
        for s, (st, c) in enumerate(zip(pipe.stages, costs)):
            k = spec.in_flight(s, num, m, num_devices)
            mem = stage_memory(cm.model, cm.train, c, *st.layers, k, m, plan.optimizer_shards)
            worst = max(worst, mem.total - c.gpu.memory_bytes)
            by_device.setdefault(st.device, []).append(mem)
        for d, mems in by_device.items():
            worst = max(worst, device_memory(mems).total - problem.cluster.gpu(d).memory_bytes)
        return worst

    cap = most_micro_batches(excess, 0.0, total)
    if cap < lo:
        return None
    return UNBOUNDED if cap >= total else cap


def _build(ctx: ShapeContext, chosen: list[tuple[Variant, int]]) -> PlanResult | None:
    """The plan of a DP answer with each pipeline on its schedule, its batch shares settled and
    re-balanced, costed in full (None where it cannot be built or does not fit)."""
    problem = ctx.problem
    pipes = layout_pipes(problem, [(t, n) for (t, _, _), n in chosen])
    plan = None if pipes is None else build_plan(problem, ctx.recompute, ctx.mbs, pipes, "exact")
    if plan is None:
        return None
    plan = drop_unneeded_recompute(problem, plan)
    trial = plan
    schedules = [v for (_, name, chunks), n in chosen for v in [(name, chunks)] * n]
    for i, (name, chunks) in enumerate(schedules):
        if name is not None:
            pipe = _chunked(problem, plan, plan.pipelines[i], SCHEDULES[name], chunks, "balanced")
            if pipe is None:
                return None
            trial = _with_pipeline(trial, i, pipe)
    trial = _settle(problem, trial, [p.num_micro_batches for p in trial.pipelines])
    best: tuple[Plan, StepCost] | None = None
    for cand in (trial, None if trial is None else _rebalanced(problem, trial)):
        s = None if cand is None else evaluate(problem, cand)
        if (
            s is not None
            and s.fits
            and (best is None or s.iteration_time_s < best[1].iteration_time_s)
        ):
            best = (cand, s)
    if best is None:
        return None
    return PlanResult("exact", *choose_schedules(problem, best[0]))  # one-chunk ones left


__all__ = ["search_exact"]
