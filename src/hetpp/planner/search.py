"""HPP search: pipelines of different shapes, a balanced split in each, a batch share per pipeline.

Hierarchy (docs/architecture.md, "Planner"):
1. Stage balance (`partition`): a template's split, evaluated once per shape (`shapes`).
2. Pipeline shapes: which templates, how many of each (`layout`), on which devices (`placement`).
   - Small clusters (few device-count vectors): exact. A dynamic program over device-count
     vectors finds the layout of least compute time (`layout.CountDP`) for each subset of GPU
     types, peeling off the templates with the largest sync + optimizer tail (which follows the
     slowest pipeline); then branch and bound over template multisets (`multisets`) ranks the
     rest by the full cost, where they are few enough.
   - Large clusters: per GPU type an exact knapsack over homogeneous depths
     (`layout.TypeKnapsack`) plus at most one mixed template taken k times, options in order
     of an optimistic bound (`candidates`); and nested homogeneous layouts, whose splits refine
     one another so that gradient buckets stay parallel. Every setting is screened with
     homogeneous pipelines; the best ones also get the layer-balanced mixed shapes and the
     two-type shapes for types that cannot hold the model alone. Two-type clusters of few
     enough device-count vectors take their mixed shapes in the exact search's count DP
     instead (`_search_pairs`), so layouts of several different mixed shapes are reached.
   - Chunk-aware: where the count DP runs (the exact path, `_search_pairs`, and every
     composition of a three-type cluster of few device-count vectors), it runs again with each
     template at the multi-chunk schedule it runs best under (`_search_chunked`), so layouts
     that only a chunked schedule makes fast reach the end; their plans are built on those
     schedules and ranked beside the schedule pass's.
3. Data balance (`balance`): integer micro-batch counts that minimize the slowest pipeline.
Micro-batch size and recomputation are outer choices ("settings"), visited in order of an
optimistic bound (`bounds.ideal_time_bound`) and skipped when it cannot beat the best plan so
far. The baselines run first, on the same templates; their plans are in hpp's space and seed the
bound, so hpp is never worse than any of them. Final ranking: the full step cost
(`hetpp.cost.step`), block-wise gradient sync and optimizer included.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from hetpp.planner.assemble import Incumbent, PlanResult
from hetpp.planner.baselines import BASELINES, SCHEDULE_FREEDOM
from hetpp.planner.bounds import ideal_time_bound
from hetpp.planner.candidates import (
    homogeneous_items,
    mixed_options,
    mixed_templates,
    nested_layouts,
    proportional_templates,
)
from hetpp.planner.idle import with_idle_pipelines
from hetpp.planner.layout import CountDP, Layout, TypeKnapsack, layout_time, min_time
from hetpp.planner.mixed_mbs import mix_micro_batch_sizes
from hetpp.planner.multisets import branch_and_bound, composition, compositions, count_multisets
from hetpp.planner.problem import Problem
from hetpp.planner.refine import estimate, refine
from hetpp.planner.resplit import resplit_if_faster
from hetpp.planner.schedules import choose_schedules, pass_bound_s
from hetpp.planner.shapes import ShapeContext, TemplateCost, Workspace
from hetpp.planner.tail import layout_tail
from hetpp.planner.variants import VariantRows, build_scheduled

Progress = Callable[[float, str], None]
"""Called with the fraction done (0..1) and what is being searched."""

EXACT_STATES = 100
"""Clusters whose device-count vectors number at most this are searched exactly."""
EXACT_TEMPLATES = 300
EXACT_MULTISETS = 20000
"""... and their template multisets, if at most this many, ranked by branch and bound."""
TOP = 2
"""Large clusters: layouts per pass ranked with the full cost."""
REFINED = 2
"""Large clusters: layouts from the end of each local-move path ranked with the full cost."""
PATIENCE = 8
"""Large clusters: options tried past the last one that improved the best estimate ..."""
PAIR_PATIENCE = 24
"""... in the two-type pass, whose best option (k copies of 1 H100 + 8 T4) can come after many
with fewer copies or other counts."""
PASS_CANDIDATES = 2
"""The fastest one-chunk plans that get the schedule pass at the end (`hetpp.planner.schedules`:
a runner-up with more bubble to remove can overtake the best)."""
OTHER_SETTINGS = 2
"""... and the best plans of at most this many other settings (micro-batch size, recomputation),
those the pass could at best make the most of (`schedules.pass_bound_s`)."""
CHUNKED_STATES = 200
"""Clusters of more than two types and at most this many device-count vectors (4 + 4 + 4
devices: 125; 3 + 5 + 7: 192) take the chunk-aware count DP over every composition in every
stage order, its answers' templates priced in full (`PRICED`), in the settings that get the
layer-balanced shapes. With the cheap price alone 3 + 5 + 7 found nothing better at 200
(its answers did not fit); priced in full it reaches the exact reference
(docs/benchmarks-search.md)."""
CHUNKED_BUILDS = 2
"""Answers of the chunk-aware count DP (`_search_chunked`) built and costed in full, per
setting (each build costs about as much as a schedule pass)."""
FIRST_BUILDS = 2
"""Three-type clusters: answers of the first (cheap-price) solve built as well as the last
solve's (the full price ranks by the plan as built, the cheap one by what the last passes may
make of it; 5 A100 + 3 V100 + 5 T4, gpt3-2.7b: 2.1152 s with the last solve's alone, 2.0041 s)."""
PRICED = 16
"""Three-type clusters (`CHUNKED_STATES`): the answers of one solve of the chunk-aware count DP
whose cheaply priced templates are priced in full before it solves again, ..."""
CHUNKED_ROUNDS = 12
"""... at most this many times. Pricing a template in full costs 20-30 ms at 12-16 devices,
200 ms at 32 (two-type clusters keep the cheap price: 16 H100 + 16 A100-40GB went from 4.6 s
to 8.5 s CPU with it and found nothing better)."""
FULL_SETTINGS = 3
"""Large clusters: settings (micro-batch size, recomputation) that get layer-balanced shapes."""
PAIR_SETTINGS = 1
"""... and that get two-type shapes for types that cannot hold the model alone."""
PAIR_DP_STATES = 1200
"""Large two-type clusters of at most this many device-count vectors (up to 33 devices of each
type) take the mixed shapes in the exact search's count DP (`_search_pairs`)."""


def search_hpp(
    problem: Problem, progress: Progress | None = None, time_limit_s: float | None = None
) -> PlanResult:
    """The fastest plan hpp finds (never slower than any baseline's). With `time_limit_s`, the
    search stops at the first check past it once it has a plan (checks: before a baseline, a
    setting, a pass or a layout option) and returns the best plan so far, saying so in its
    note."""
    t0 = time.perf_counter()
    limit = math.inf if time_limit_s is None else t0 + time_limit_s
    ws = Workspace(problem, schedule_pass=False)
    say = progress or (lambda f, s: None)
    inc = Incumbent(problem, "hpp", keep=PASS_CANDIDATES)

    stopped = []  # set when a check stops the search
    chunked: list[PlanResult] = []  # plans of the chunk-aware count DPs, schedules chosen

    def out_of_time() -> bool:
        if inc.result is not None and time.perf_counter() > limit:
            stopped.append(True)
        return bool(stopped)

    seeds = []  # the baselines' one-chunk plans: they seed the search, and get their own pass
    for i, (name, run) in enumerate(BASELINES.items()):
        if out_of_time():
            break
        say(0.1 * i, f"baseline {name}")
        seeds.append(run(problem, ws))
        inc.offer_result(seeds[-1])
    settings = sorted(ws.settings(), key=lambda s: ideal_time_bound(problem, *s))
    screened: list[tuple[float, ShapeContext]] = []
    for i, (rc, mbs) in enumerate(settings):
        say(0.3 + 0.4 * i / max(1, len(settings)), f"micro-batch {mbs}, recompute {rc}")
        if out_of_time():
            break
        if ideal_time_bound(problem, rc, mbs) >= inc.bound:
            continue
        ctx = ws.context(rc, mbs)
        if _exact_search_fits(ctx):
            _search_exact(ctx, inc, chunked)
        else:
            screened.append((_search_decomposed(ctx, inc, None, out_of_time), ctx))
    # Large clusters: the settings that did best with homogeneous pipelines get the mixed
    # shapes too (the layer-balanced ones, then two-type ones for types that cannot hold the
    # model alone), which cost the most templates.
    ranked = [ctx for _, ctx in sorted(screened, key=lambda x: x[0])]
    passes = [("proportional", c) for c in ranked[:FULL_SETTINGS]]
    passes += [("pairs", c) for c in ranked[:PAIR_SETTINGS]]
    for j, (kind, ctx) in enumerate(passes):
        say(0.7 + 0.3 * j / len(passes), f"{kind} shapes, micro-batch {ctx.mbs}")
        if out_of_time():
            break
        if ideal_time_bound(problem, ctx.recompute, ctx.mbs) < inc.bound:
            _search_decomposed(ctx, inc, kind, out_of_time, chunked)
    if inc.result is None:
        return PlanResult("hpp", None, None, time.perf_counter() - t0, "no plan fits")
    say(0.99, "schedules per pipeline")
    baselines: list[PlanResult] = []
    passed = after_schedule_pass(
        problem, inc.results, seeds, list(inc.per_setting.values()), baselines
    )
    say(0.995, "micro-batch size per pipeline")
    best = with_last_passes(problem, ws, [passed, *chunked], "hpp")
    say(1.0, "done")
    notes = [f"the {best.strategy} plan was the best found"] if best.strategy != "hpp" else []
    if stopped:
        notes.insert(0, f"time limit of {time_limit_s:g} s reached: the best plan found so far")
    plan = best.plan.model_copy(update={"strategy": "hpp"})
    took_s = time.perf_counter() - t0
    return PlanResult("hpp", plan, best.step, took_s, "; ".join(notes), tuple(baselines))


def with_last_passes(
    problem: Problem, ws: Workspace, results: list[PlanResult], strategy: str
) -> PlanResult:
    """The fastest of `results[0]` (the schedule pass's plan) and the fastest of the others
    (the chunk-aware DP's plans) once each has had hpp's last passes, the micro-batch size
    per pipeline (`mixed_mbs`), GPipe pipelines on the devices left idle (`idle`) and single
    cut moves under the full step cost (`resplit`): they can turn the order of the two around
    (ranking them before made the search slower with the chunk-aware DP than without on 4 H100
    + 60 T4, gpt3-1.3b)."""
    finals = []
    for got in [results[0], *sorted(results[1:], key=lambda r: r.iteration_time_s)[:1]]:
        plan, step = mix_micro_batch_sizes(problem, ws, got.plan, got.step)
        plan, step = with_idle_pipelines(problem, plan, step)
        plan, step = resplit_if_faster(problem, plan, step)
        finals.append(got if step is got.step else PlanResult(strategy, plan, step))
    return min(finals, key=lambda r: r.iteration_time_s)


def after_schedule_pass(
    problem: Problem,
    results: list[PlanResult],
    baselines: list[PlanResult],
    others: list[PlanResult] = (),
    baselines_passed: list[PlanResult] | None = None,
) -> PlanResult:
    """The fastest of `results` once the schedule pass (`hetpp.planner.schedules`) has run on
    each, and of the one-chunk `baselines` after the pass each of them gets when it runs alone
    (its own split and batch freedom): so the search is never slower than a baseline, whichever
    schedules the pass finds for either. `others` (the best plan of each setting) get the pass
    too (at most `OTHER_SETTINGS`), in order of what it could at best make of them
    (`pass_bound_s`), while that can still beat the best so far: a larger micro-batch size,
    slower with 1F1B, can win once its bubble is gone. `baselines_passed` (if given) receives
    the baselines' plans after their pass, what each baseline returns alone."""

    def passed(r: PlanResult, *freedom) -> PlanResult:
        return replace(
            r, **dict(zip(("plan", "step"), choose_schedules(problem, r.plan, *freedom)))
        )

    done = [passed(r) for r in results]
    alone = [passed(b, *SCHEDULE_FREEDOM[b.strategy]) for b in baselines if b.feasible]
    done += alone
    if baselines_passed is not None:
        baselines_passed.extend(alone)
    best = min(done, key=lambda r: r.iteration_time_s)
    if problem.chunked_schedules:
        seen = {r.iteration_time_s for r in results}
        rest = [(pass_bound_s(r.plan, r.step), r) for r in others if r.iteration_time_s not in seen]
        for bound, r in sorted(rest, key=lambda x: x[0])[:OTHER_SETTINGS]:
            if bound >= best.iteration_time_s:
                break
            best = min(best, passed(r), key=lambda r: r.iteration_time_s)
    return best


def _search_exact(
    ctx: ShapeContext, inc: Incumbent, chunked: list[PlanResult] | None = None
) -> None:
    """Small clusters: every multiset of templates, solved exactly for the compute time.

    The step also pays gradient sync and optimizer after the slowest pipeline: about the largest
    tail among the templates used, and less with fewer pipelines or nodes. So for every subset
    of GPU types, solve, then peel: forbid templates with the largest tail used and solve again
    (each answer is optimal for every tail cap down to its own largest tail), until the compute
    time alone reaches the best full cost found (a lower bound: nothing further can win).
    With `chunked`, the same over each template at its best schedule (`_search_chunked`)."""
    total = ctx.problem.micro_batches(ctx.mbs)
    templates = _all_templates(ctx)
    if not templates:
        return
    dp = CountDP(templates, ctx.counts, total, ctx.problem.schedule_spec.devices_within_batch)
    masks = _subset_masks(ctx, templates)
    for mask in masks:
        _peel(ctx, dp, mask, lambda: inc.bound, lambda lay: inc.offer(ctx, [lay]))
    if chunked is not None:
        _search_chunked(ctx, templates, masks, inc, chunked)
    # With a good incumbent, rank the remaining multisets by the full cost where they are
    # few enough; their lower bound (`multisets.lower_bounds`) prunes most of them.
    shapes = [t for _, t in templates]
    if count_multisets([c for c, _ in templates], ctx.counts) <= EXACT_MULTISETS:
        branch_and_bound(ctx, shapes, lambda: inc.bound, lambda lay: inc.offer(ctx, [lay]))


def _subset_masks(
    ctx: ShapeContext, templates: list[tuple[tuple[int, ...], TemplateCost]]
) -> list[np.ndarray]:
    """Per non-empty subset of GPU types (the most types first), which templates use only
    those types."""
    comps = np.array([c for c, _ in templates]) > 0
    subsets = sorted(itertools.product((False, True), repeat=len(ctx.keys)), key=lambda q: -sum(q))
    return [~(comps & ~np.array(q)).any(axis=1) for q in subsets if any(q)]


def _peel(
    ctx: ShapeContext,
    dp: CountDP,
    mask: np.ndarray,
    bound: Callable[[], float],
    take: Callable[[Layout], None],
) -> None:
    """Solve for the least compute time over the templates `mask` allows, then forbid those
    with the largest tail used and solve again, until the compute time alone reaches `bound()`;
    `take` each answer."""
    total = ctx.problem.micro_batches(ctx.mbs)
    tails = np.array([t.tail_s for t in dp.templates])
    while mask.any():
        got = min_time(lambda t, m=mask: dp(t, mask=m), total, use_tail=False)
        if got is None or got[0] >= bound():
            break
        take(got[1])
        mask = mask & (tails < max(x.tail_s for x, _ in got[1]))


def _search_chunked(
    ctx: ShapeContext,
    templates: list[tuple[tuple[int, ...], TemplateCost]],
    masks: list[np.ndarray],
    inc: Incumbent,
    found: list[PlanResult],
    price: bool = False,
) -> None:
    """The count DP again with each template at the schedule it runs its share of the batch
    (in proportion to its devices) fastest under, peeled by tail over each of `masks` until
    the compute time reaches the best estimate so far; the best `CHUNKED_BUILDS` answers by
    estimate (compute time and tail) that use a multi-chunk schedule are built on their
    schedules (`variants.build_scheduled`, memory and torch's micro-batch rules included) into
    `found`. So a layout that only a multi-chunk schedule makes fast (fewer, deeper
    pipelines) is ranked as it will run, not by its 1F1B bubble. Rows are priced cheaply
    (`variants.best_variant`); with `price`, the templates the best `PRICED` answers use are
    then priced in full, memory cap included (`variants.VariantRows`), and the DP solved again
    until its best answers use no cheap row (at most `CHUNKED_ROUNDS` solves), so the answers
    built are ranked by what they will cost, not by a price that ignores whether they fit.
    Nothing when no template gains by a schedule."""
    # what this setting must beat: the best plan so far (priced: the chunk-aware DP's of
    # other settings too)
    bound_s = min([inc.bound, *(r.iteration_time_s for r in found if price)])
    if price and ideal_time_bound(ctx.problem, ctx.recompute, ctx.mbs) >= bound_s:
        return
    total = ctx.problem.micro_batches(ctx.mbs)
    table = VariantRows(ctx, templates, total)
    if not table.chunked:
        return
    builds: list[list] = []  # the first solve's best (`FIRST_BUILDS`), then the last's
    for solve in range(CHUNKED_ROUNDS if price else 1):
        ranked = _chunked_answers(ctx, table, masks, bound_s)
        builds += [table.of(x) for x in ranked[:FIRST_BUILDS] if solve == 0]
        if not price or solve == CHUNKED_ROUNDS - 1:
            break
        if not any([table.price(layout) for layout in ranked[:PRICED]]):
            break
    last = [table.of(x) for x in ranked[:CHUNKED_BUILDS]]
    for variants in builds + [v for v in last if v not in builds]:
        got = build_scheduled(ctx, variants)
        if got is not None and got.feasible:
            found.append(got)


def _chunked_answers(
    ctx: ShapeContext, table: VariantRows, masks: list[np.ndarray], bound_s: float
) -> list[Layout]:
    """One solve of `_search_chunked`: the count DP over `table`'s rows peeled by tail over
    each of `masks` (over its templates) until the compute time reaches `bound_s` or the best
    estimate so far; the answers that use a multi-chunk schedule, best estimate first."""
    total = ctx.problem.micro_batches(ctx.mbs)
    dp = CountDP(table.rows, ctx.counts, total, ctx.problem.schedule_spec.devices_within_batch)
    chunked = {id(r) for (_, r), (_, name, _) in zip(table.rows, table.meaning) if name}
    answers: list[tuple[float, Layout]] = []

    def take(layout: Layout) -> None:
        if any(id(r) in chunked for r, _ in layout):  # the one-chunk DP has the rest
            answers.append((layout_time(layout, total, False) + layout_tail(ctx, layout), layout))

    source = np.array(table.source)
    for mask in masks:
        _peel(ctx, dp, mask[source], lambda: min([bound_s, *(e for e, _ in answers)]), take)
    return [layout for _, layout in sorted(answers, key=lambda x: x[0])]


def _search_pairs(
    ctx: ShapeContext,
    inc: Incumbent,
    items: dict[str, list[TemplateCost]],
    chunked: list[PlanResult] | None = None,
) -> float:
    """The mixed pass of two-type clusters with few device-count vectors (`PAIR_DP_STATES`):
    the count DP of the exact search over the homogeneous depths and every shape with a few
    devices of either type (`mixed_templates(every=True)`), peeled by tail as there until the
    compute time reaches the best estimate; the best `TOP` answers by estimate get the full
    cost, and the best one local moves. It reaches layouts of several different mixed shapes
    next to homogeneous ones, which one mixed shape taken k times cannot (32 A100 +
    32 RTX-4090: 2 A100 + 13 RTX-4090, 2 A100 + 14 RTX-4090 and 1 RTX-4090 + 8 A100 next to
    four 1 RTX-4090 + 5 A100), and needs no order of options by a bound (16 H100 +
    16 A100-40GB: two 3 A100 + 8 H100 next to 10 A100, an option the bound ranked 201st of
    240). With `chunked`, the count DP again at each template's best schedule
    (`_search_chunked`). Returns the best estimate."""
    templates = [t for v in items.values() for t in v]
    templates = list(dict.fromkeys(templates + mixed_templates(ctx, items, every=True)))
    if not templates:
        return math.inf
    total = ctx.problem.micro_batches(ctx.mbs)
    budget = ctx.problem.schedule_spec.devices_within_batch
    rows = [(composition(ctx, t), t) for t in templates]
    dp = CountDP(rows, ctx.counts, total, budget)
    found: list[tuple[float, Layout]] = []
    _peel(
        ctx,
        dp,
        np.ones(len(templates), dtype=bool),
        lambda: min([inc.bound, *(e for e, _ in found)]),
        lambda lay: found.append((estimate(ctx, lay), lay)),
    )
    if chunked is not None:
        _search_chunked(ctx, rows, [np.ones(len(rows), dtype=bool)], inc, chunked)
    if not found:
        return math.inf
    found.sort(key=lambda x: x[0])
    inc.offer(ctx, [lay for _, lay in found[:TOP]])
    path = refine(ctx, found[0][1])
    if path:
        inc.offer(ctx, path[-REFINED:])
        return estimate(ctx, path[-1])
    return found[0][0]


def _search_decomposed(
    ctx: ShapeContext,
    inc: Incumbent,
    mixed: str | None,
    out_of_time: Callable[[], bool] = lambda: False,
    chunked: list[PlanResult] | None = None,
) -> float:
    """Large clusters: per-type knapsack over homogeneous depths plus (`mixed`) one mixed
    template taken k times: the layer-balanced shapes ("proportional") or two-type shapes for
    types that cannot hold the model alone ("pairs"). Options go in order of their bound, cut
    off by it or after `PATIENCE` options without a better estimate; without `mixed`, nested
    homogeneous layouts too. The best few by estimate get the full cost; with `mixed`, local
    moves (`refine`) from the best; no options once `out_of_time()`. The two-type pass of a
    two-type cluster of at most `PAIR_DP_STATES` device-count vectors is `_search_pairs`.
    Returns the best estimate."""
    total = ctx.problem.micro_batches(ctx.mbs)
    budget = ctx.problem.schedule_spec.devices_within_batch
    items = homogeneous_items(ctx)
    states = math.prod(n + 1 for n in ctx.counts)
    if mixed == "pairs" and len(ctx.keys) == 2 and states <= PAIR_DP_STATES:
        return _search_pairs(ctx, inc, items, chunked)
    if chunked is not None and mixed == "proportional" and _chunked_dp_fits(ctx, states):
        # every order: the one-chunk order that Pareto-dominates another can be the one that
        # does not fit once V-placed (its first device holds the first and the last chunk)
        every = [(c, t) for c in compositions(ctx) for t in ctx.orders(c, exhaustive=True)]
        _search_chunked(ctx, every, _subset_masks(ctx, every), inc, chunked, price=True)
    templates: list[TemplateCost] = []
    if mixed == "proportional":
        templates = proportional_templates(ctx)
    elif mixed == "pairs":
        templates = mixed_templates(ctx, items)
    avail = dict(zip(ctx.keys, ctx.counts))
    found: list[tuple[float, Layout]] = []
    best, stale = inc.bound, 0
    patience = PAIR_PATIENCE if mixed == "pairs" else PATIENCE
    for lb, fixed in mixed_options(ctx, items, templates, total, budget):
        if lb >= best or stale >= patience or out_of_time():
            break
        if mixed and not fixed:
            continue  # done in the homogeneous pass
        left = dict(avail)
        for t, k in fixed:
            for key, n in t.runs:
                left[key] -= n * k
        stale += 1
        for single in (False, True):
            solver = TypeKnapsack(items, left, fixed, total, True, budget, single)
            got = min_time(solver, total, True)
            if got is None:
                continue
            est = layout_time(got[1], total, use_tail=False) + layout_tail(ctx, got[1])
            found.append((est, got[1]))
            if est < best * (1 - 1e-3):
                stale = 0
            best = min(best, est)
    if mixed is None:
        for layout in nested_layouts(ctx, items):
            t = layout_time(layout, total, use_tail=False)
            if t < math.inf:
                found.append((t + layout_tail(ctx, layout), layout))
    found.sort(key=lambda x: x[0])
    top = [layout for _, layout in found[:TOP]]
    inc.offer(ctx, top)
    # Local moves from the best mixed layout only: they are what reaches several mixed shapes,
    # and from every pass's layouts they would cost more than the rest of the search.
    path = refine(ctx, found[0][1]) if mixed and found else []
    if path:
        inc.offer(ctx, path[-REFINED:])
        found.append((estimate(ctx, path[-1]), path[-1]))
    return min(e for e, _ in found) if found else math.inf


def _chunked_dp_fits(ctx: ShapeContext, states: int) -> bool:
    """A cluster of more than two types whose every composition the chunk-aware count DP can
    afford (two-type clusters take it in `_search_pairs`)."""
    return len(ctx.keys) > 2 and states <= CHUNKED_STATES


def _exact_search_fits(ctx: ShapeContext) -> bool:
    """Few enough device-count vectors (and so templates) to search exactly."""
    if math.prod(n + 1 for n in ctx.counts) > EXACT_STATES:
        return False
    return sum(1 for _ in compositions(ctx)) <= EXACT_TEMPLATES


def _all_templates(ctx: ShapeContext) -> list[tuple[tuple[int, ...], TemplateCost]]:
    """Every composition with every stage order (small clusters afford them all; dropping the
    orders that look dominated on the closed form loses up to a percent on the full cost)."""
    return [(c, t) for c in compositions(ctx) for t in ctx.orders(c, exhaustive=True)]
