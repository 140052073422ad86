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
runs as hpp runs it (`search._search_exact` on every setting with its chunk-aware count DP, the
baselines, the schedule pass on its best plans: `after_schedule_pass`), and, as in hpp, the
pass's plan and the fastest of the DPs' plans each get hpp's last passes, micro-batch size
per pipeline and single cut moves (`search.with_last_passes`: `mixed_mbs`, `resplit`), the
fastest kept: so this search is never worse than that path (`bench/search_quality.py`'s "exact
path" column: `plan` with the exact path on every cluster), which before reached plans it did
not (16 H100 + 16 A100-40GB: 3.0469 s against 3.2365 s, by the chunk-aware DP and the
micro-batch size pass it lacked).

What "exact" covers: the compute time (closed form at each template's best links, the first
line of each schedule's timing rule, as data balance reads it) of every multiset of templates
and schedules per setting. Not covered exactly: the full cost's sync and optimizer tail
(peeled by each template's estimated tail, as hpp's exact path does), placement on real links,
a chunked pipeline's memory cap (`_memory_cap`: at the template's representative placement),
per-stage recomputation dropped after the search (`recompute.drop_unneeded_recompute`), more
than `schedules.CHUNK_COUNTS` chunks, a micro-batch size per pipeline beyond what the
micro-batch size pass reaches from the plans above, optimizer sharding (`planner.sharding`:
the benchmark's problems do not shard), and the fully sharded family (`planner.fsdp`, which
`plan --strategy best` runs beside hpp, not here). What the default search reaches that this
may not: a plan of the large-cluster walk (knapsack, mixed options, local moves) better than
every answer here, where the peeled tail estimate ranks it out; `bench/search_quality.py`
prints a negative gap then.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from hetpp.planner.assemble import (
    PlanResult,
)
from hetpp.planner.bounds import ideal_time_bound
from hetpp.planner.halves import with_half_blocks
from hetpp.planner.layout import CountDP, Layout
from hetpp.planner.oracle import seeded
from hetpp.planner.problem import Problem
from hetpp.planner.schedules import CHUNK_COUNTS
from hetpp.planner.search import (
    _all_templates,
    _peel,
    _search_exact,
    after_schedule_pass,
    with_last_passes,
)
from hetpp.planner.shapes import ShapeContext, TemplateCost
from hetpp.planner.variants import Variant, build_scheduled, priced_variants


def search_exact(problem: Problem) -> PlanResult:
    """The best plan of hpp's space over layouts and per-pipeline schedules (module docstring:
    what is exact and what is not). Slow: a benchmark reference, not a planner."""
    t0 = time.perf_counter()
    ws, inc, seeds = seeded(problem, "exact")
    found: list[PlanResult] = []  # chunked plans, costed in full
    chunked: list[PlanResult] = []  # the exact path's chunk-aware DP's plans

    def best_s() -> float:
        return min([inc.bound, *(r.iteration_time_s for r in found + chunked)])

    for rc, mbs in sorted(ws.settings(), key=lambda s: ideal_time_bound(problem, *s)):
        bound = ideal_time_bound(problem, rc, mbs)  # no plan of this setting beats it
        ctx = ws.context(rc, mbs)
        if bound < inc.bound:
            _search_exact(ctx, inc, chunked)  # hpp's exact path, as hpp runs it
        templates = _all_templates(ctx) if bound < best_s() else []
        if templates:
            _search_variants(ctx, templates, found, best_s)
    if inc.result is None and not found:
        return PlanResult("exact", None, None, time.perf_counter() - t0, "no plan fits")
    finals = []
    if inc.result is not None:  # the exact path's plan, as hpp ends it
        path = after_schedule_pass(problem, inc.results, seeds, list(inc.per_setting.values()))
        finals.append(with_last_passes(problem, ws, [path, *chunked], "exact"))
    if found:
        best_found = min(found, key=lambda r: r.iteration_time_s)
        finals.append(with_last_passes(problem, ws, [best_found], "exact"))
    best = min(finals, key=lambda r: r.iteration_time_s)
    plan = best.plan.model_copy(update={"strategy": "exact"})
    # ... and the half-block pass hpp's search ends with (`planner.plan`)
    return with_half_blocks(problem, PlanResult("exact", plan, best.step, time.perf_counter() - t0))


def _search_variants(ctx: ShapeContext, templates, found, best_s) -> None:
    """The count DP over every (template, schedule) of one setting, peeled by tail per subset
    of GPU types (as `search._search_exact`); each answer built (`variants.build_scheduled`)
    and kept in `found`."""
    problem = ctx.problem
    rows, meaning = variant_rows(ctx, templates)
    total = problem.micro_batches(ctx.mbs)
    dp = CountDP(rows, ctx.counts, total, problem.schedule_spec.devices_within_batch)
    index = {id(tc): i for i, (_, tc) in enumerate(rows)}
    comps = np.array([c for c, _ in rows]) > 0
    subsets = sorted(itertools.product((False, True), repeat=len(ctx.keys)), key=lambda q: -sum(q))

    def take(layout: Layout) -> None:
        got = build_scheduled(ctx, [(meaning[index[id(tc)]], n) for tc, n in layout], "exact")
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
    (`variants.priced_variants`), and what each row is: (one-chunk template, schedule, chunks)."""
    rows: list[tuple[tuple[int, ...], TemplateCost]] = []
    meaning: list[Variant] = []
    for comp, t in templates:
        for v, name, chunks in priced_variants(ctx, t, CHUNK_COUNTS):  # more than hpp ranks
            rows.append((comp, v))
            meaning.append((t, name, chunks))
    return rows, meaning


__all__ = ["search_exact"]
