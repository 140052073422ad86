"""Templates as multi-chunk schedules would run them, for layout searches that rank by them.

A layout search ranks templates by their one-chunk cost; the schedule pass moves pipelines to
multi-chunk schedules only afterwards, on the few plans it gets. A layout that is slower under
1F1B but faster once chunked (fewer, deeper pipelines: more bubble to remove) is then never
seen. `best_variant` prices a template under each multi-chunk schedule the problem allows,
cheaply (no plan, no memory walk), so that a count DP can rank templates by the schedule they
run best under; `build_scheduled` turns such a DP answer into a plan with each pipeline on its
schedule, costed in full (memory included), so a variant priced too well is dropped there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import NamedTuple

from hetpp.cost.memory import device_memory, most_micro_batches, stage_memory
from hetpp.cost.pipeline import fill_and_beat, pipeline_done_s, steady_time_s, weight_grad_s
from hetpp.cost.step import stage_layer_costs
from hetpp.planner.assemble import PlanResult, build_plan, evaluate_below, layout_pipes
from hetpp.planner.problem import Problem
from hetpp.planner.recompute import drop_unneeded_recompute
from hetpp.planner.schedules import (
    _chunked,
    _dealt,
    _flips,
    _groups,
    _rebalanced,
    _settle,
    _with_pipeline,
    choose_schedules,
)
from hetpp.planner.shapes import UNBOUNDED, ShapeContext, TemplateCost
from hetpp.specs.plan import Plan
from hetpp.specs.schedule import SCHEDULES

Variant = tuple[TemplateCost, str | None, int]
"""A one-chunk template, the schedule its pipelines run (None: the problem's own) and chunks."""

RANKED_CHUNK_COUNTS = {"one": (1,), "loop": (2,), "v": (2,)}
"""Chunk counts per placement the chunk-aware ranking prices templates at. The schedule pass
tries more (`schedules.CHUNK_COUNTS`: up to 4 on a loop) on the plans the ranking chose, and
finds the larger counts from these answers: ranked at 3-4 loop chunks too, lab-64 gpt3-1.3b
took a shape whose sharded re-cut ran 360.7 samples/s against 372.1, the whole planner
benchmark searched 83.3 s against 78.8, and no row gained."""

BUBBLE_SHARE = 0.005
"""`best_variant` skips a template whose one-chunk time at its share is within this share of
the bubble-free time (each micro-batch its busiest device's work): no schedule gains more."""


def ranked_schedules(ctx: ShapeContext) -> tuple[str, ...]:
    """The schedules templates are priced under: the multi-chunk ones the problem allows. Not
    a one-chunk one (zbh1): it keeps a pipeline's shape and cuts, so the schedule pass tries it
    on whatever layout wins, and its cheap price assumes the one-chunk memory cap where each of
    its stages holds S micro-batches to their W: its rows took count-DP answers from the
    chunked layouts that win in full (lab-64 gpt3-1.3b: 0.7501 s against 0.7228 s without)."""
    names = ctx.problem.schedules_to_try(ctx.recompute)
    return tuple(n for n in names if SCHEDULES[n].placement != "one")


def best_variant(ctx: ShapeContext, t: TemplateCost, share: int) -> tuple[TemplateCost, Variant]:
    """The row a count DP should rank `t` by, and what it is: `t` itself, or `t` priced under
    the multi-chunk schedule that runs `share` micro-batches fastest if one beats it there
    (the first of `cheap_variants`)."""
    got = cheap_variants(ctx, t, share)
    return (got[0].synced(share), got[0].variant) if got else (t, (t, None, 1))


def cheap_variants(
    ctx: ShapeContext, t: TemplateCost, share: int
) -> list[tuple[TemplateCost, Variant]]:
    """`t` priced under each multi-chunk schedule that runs `share` micro-batches faster than
    its one chunk does, fastest first, as (row, what it is); [] when none does, or when `t` is
    within `BUBBLE_SHARE` of bubble-free.

    The price is cheap, not exact: each device keeps its work per micro-batch (as the pass's
    re-split aims), dealt evenly over its chunks in the schedule's placement; a hop between
    stages on the same device is free, the loop's wrap-around hop costs the template's slowest
    one; fill and beat by the schedule's timing rule; fewest micro-batches of the chunked
    shape; the one-chunk memory cap (`VariantRows` prices the rows a DP answer uses in full)."""
    work = [f + b for f, b in zip(t.fwd_s, t.bwd_s)]
    own_s = t.time(max(share, t.lo))
    if own_s <= (1 + BUBBLE_SHARE) * max(share, t.lo) * max(work):
        return []
    num_devices = t.num_stages
    wrap = max(t.comm_s, default=0.0)
    found = []
    for name in ranked_schedules(ctx):
        spec = SCHEDULES[name]
        for chunks in RANKED_CHUNK_COUNTS[spec.placement]:
            num = chunks * num_devices
            if num > ctx.layer_list_len:
                continue
            at = [spec.device_index(s, num_devices) for s in range(num)]
            fwd = [t.fwd_s[d] / chunks for d in at]
            bwd = [t.bwd_s[d] / chunks for d in at]
            comm = [
                0.0 if a == b else t.comm_s[min(a, b)] if abs(a - b) == 1 else wrap
                for a, b in itertools.pairwise(at)
            ]
            weight = [weight_grad_s(b, f if ctx.recompute else 0.0) for f, b in zip(fwd, bwd)]
            lo = next(
                (m for m in range(spec.min_micro_batches(num), share + 1)
                 if spec.micro_batch_problem(num, num_devices, m) is None),
                None,
            )  # fmt: skip
            if lo is None:
                continue  # cannot run its share
            fill, beat = fill_and_beat(fwd, bwd, comm, name, num_devices, weight)
            got = steady_time_s(fill, beat, share)
            if got < own_s:
                row = replace(t, fill_s=fill, beat_s=beat, lo=lo)
                found.append((got, row, (t, name, chunks), (fwd, bwd, comm, weight, at)))
    found.sort(key=lambda x: x[0])
    return [Cheap(row, variant, parts) for _, row, variant, parts in found]


class Cheap(NamedTuple):
    """A template priced cheaply under one multi-chunk schedule (`cheap_variants`)."""

    row: TemplateCost
    """The template with the schedule's fill, beat and fewest micro-batches."""
    variant: Variant
    parts: tuple
    """(forward, backward, transfer, weight-gradient seconds, device) of its chunked stages."""

    def synced(self, share: int) -> TemplateCost:
        """`row` with its chunks' sync at `share` micro-batches where the placement is a loop
        (`_with_chunk_sync`). A V's re-split gives each device about its work in time
        (`schedules._chunked`), not its layer count dealt over its chunks: cuts this price
        cannot know, so its one-chunk buckets stand in (measured closer on the 3-type bench
        case than per-chunk guesses)."""
        if SCHEDULES[self.variant[1]].placement != "loop":
            return self.row
        return _with_chunk_sync(self.row, self.variant, *self.parts, max(share, self.row.lo))


def _with_chunk_sync(
    row: TemplateCost, variant: Variant, fwd, bwd, comm, weight, at: list[int], m: int
) -> TemplateCost:
    """`row` with what the sync of its chunks needs (`TemplateCost.chunk_bounds`): each
    device's layers dealt over its chunks, as the pass re-splits a loop placement
    (`schedules._dealt`), and when each stage's gradients are final at `m` micro-batches, from
    the same graph as the full cost."""
    t, name, chunks = variant
    counts = [t.bounds[d + 1] - t.bounds[d] for d in range(t.num_stages)]
    cuts = _dealt(t.bounds[0], counts, chunks)
    total, final = pipeline_done_s(fwd, bwd, comm, m, name, t.num_stages, weight)
    return replace(
        row,
        chunk_bounds=cuts,
        chunk_devices=tuple(at),
        chunk_final_s=tuple(f - total for f in final),
    )


class VariantRows:
    """A count DP's rows for templates at the multi-chunk schedule each runs best under,
    priced cheaply (`best_variant`) until a DP answer uses one, then in full (`priced_variants`:
    its one chunk and every schedule, memory cap included) and solved again
    (`search._search_chunked`). The cheap price ignores memory and the re-split's rounding, and
    under a V placement a template's memory differs from its one-chunk order's (its first
    device holds the first and the last chunk), so a cheap row can win the DP where its
    pipeline does not fit its share (4 A100 + 4 V100 + 4 T4: 2 A100 + 4 T4 + 2 V100 in ZB-V
    fits 9 of 32 micro-batches). Pricing every template in full, as the exact reference does,
    costs 20-30 ms per template; here only those that answers use are."""

    def __init__(
        self, ctx: ShapeContext, templates: list[tuple[tuple[int, ...], TemplateCost]], total: int
    ):
        self.ctx = ctx
        self.rows: list[tuple[tuple[int, ...], TemplateCost]] = []
        """(composition, DP row), as `layout.CountDP` takes them."""
        self.meaning: list[Variant] = []
        """What each row is: (one-chunk template, schedule, chunks)."""
        self.source: list[int] = []
        """Index in `templates` of each row's template."""
        self._cheap: list[bool] = []
        self._templates = templates
        units = sum(ctx.counts)
        for i, (c, t) in enumerate(templates):
            row, what = best_variant(ctx, t, max(1, round(total * sum(c) / units)))
            self._add(i, row, what, what[1] is not None)

    @property
    def chunked(self) -> bool:
        """Whether any row runs a multi-chunk schedule."""
        return any(name is not None for _, name, _ in self.meaning)

    def of(self, layout: list[tuple[TemplateCost, int]]) -> list[tuple[Variant, int]]:
        """What a DP answer's rows are, with their counts."""
        index = {id(r): k for k, (_, r) in enumerate(self.rows)}
        return [(self.meaning[index[id(r)]], n) for r, n in layout]

    def price(self, layout: list[tuple[TemplateCost, int]]) -> bool:
        """Price in full the templates of the cheap rows `layout` uses (rows no longer in the
        table are skipped); whether any was."""
        used = {id(r) for r, _ in layout}
        stale = {
            self.source[k] for k, (_, r) in enumerate(self.rows) if id(r) in used and self._cheap[k]
        }
        if not stale:
            return False
        keep = [k for k, i in enumerate(self.source) if i not in stale]
        self.rows, self.meaning, self.source, self._cheap = (
            [xs[k] for k in keep] for xs in (self.rows, self.meaning, self.source, self._cheap)
        )
        for i in sorted(stale):
            t = self._templates[i][1]
            for row, name, chunks in priced_variants(self.ctx, t):
                self._add(i, row, (t, name, chunks), False)
        return True

    def _add(self, i: int, row: TemplateCost, what: Variant, cheap: bool) -> None:
        self.rows.append((self._templates[i][0], row))
        self.meaning.append(what)
        self.source.append(i)
        self._cheap.append(cheap)


def priced_variants(
    ctx: ShapeContext, t: TemplateCost, counts: Mapping[str, tuple[int, ...]] = RANKED_CHUNK_COUNTS
) -> list[tuple[TemplateCost, str | None, int]]:
    """`t` as it is, and as each multi-chunk schedule would run it at each of `counts` (chunk
    counts per placement), priced in full (`full_variant`)."""
    out: list[tuple[TemplateCost, str | None, int]] = [(t, None, 1)]
    plan = one_pipeline_plan(ctx, t)
    if plan is None:
        return out
    for name in ranked_schedules(ctx):
        for chunks in counts[SCHEDULES[name].placement]:
            v = full_variant(ctx, t, plan, name, chunks)
            if v is not None:
                out.append((v, name, chunks))
    return out


def one_pipeline_plan(ctx: ShapeContext, t: TemplateCost) -> Plan | None:
    """A plan of `t` alone at a representative placement, taking the whole batch (what
    `full_variant` re-splits); None where it cannot be placed or built."""
    problem = ctx.problem
    if not ranked_schedules(ctx):
        return None
    pipes = layout_pipes(problem, [(t, 1)])
    if pipes is None:
        return None
    total = problem.micro_batches(ctx.mbs)
    return build_plan(problem, ctx.recompute, ctx.mbs, pipes, "hpp", [total])


def full_variant(
    ctx: ShapeContext, t: TemplateCost, plan: Plan, name: str, chunks: int
) -> TemplateCost | None:
    """`t` as schedule `name` at `chunks` chunks would run it, priced in full: fill, beat,
    fewest micro-batches and memory cap of the pipeline the schedule pass would re-split from
    `plan` (`one_pipeline_plan`: milliseconds per template and schedule); None where it cannot
    run."""
    problem, spec = ctx.problem, SCHEDULES[name]
    total = problem.micro_batches(ctx.mbs)
    pipe = _chunked(problem, plan, plan.pipelines[0], spec, chunks, "balanced")
    if pipe is None:
        return None
    trial = _with_pipeline(plan, 0, pipe)
    groups = _groups(problem, trial)
    if groups is None:
        return None
    lo = next(
        (m for m in range(1, total + 1) if spec.micro_batch_problem(
            len(pipe.stages), len(pipe.devices), m) is None),
        None,
    )  # fmt: skip
    hi = None if lo is None else _memory_cap(problem, trial, lo, total)
    if hi is None:
        return None
    g = groups[0]
    return replace(t, fill_s=g.fill_s, beat_s=g.beat_s, lo=lo, hi=hi)


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


def build_scheduled(
    ctx: ShapeContext, chosen: list[tuple[Variant, int]], strategy: str = "hpp"
) -> PlanResult | None:
    """The plan of a count DP answer over variants, each pipeline on its schedule (V-placed
    ones also with their devices reversed, `schedules._flips`: the price cannot tell the two
    orders apart), its batch shares settled and re-balanced, costed in full, then the schedule
    pass for the one-chunk pipelines left (None where it cannot be built or does not fit)."""
    problem = ctx.problem
    pipes = layout_pipes(problem, [(t, n) for (t, _, _), n in chosen])
    plan = None if pipes is None else build_plan(problem, ctx.recompute, ctx.mbs, pipes, strategy)
    if plan is None:
        return None
    plan = drop_unneeded_recompute(problem, plan)
    schedules = [v for (_, name, chunks), n in chosen for v in [(name, chunks)] * n]
    best = None
    for flip in (False, True):
        for cand in _scheduled(problem, plan, schedules, flip):
            # only a fitting candidate faster than the best so far is kept: `evaluate_below`
            # rules the others out on memory or their slowest pipeline, before the full cost
            s = evaluate_below(problem, cand, math.inf if best is None else best[1])
            if s is not None and s.fits and (best is None or s.iteration_time_s < best[1]):
                best = (cand, s.iteration_time_s)
    if best is None:
        return None
    return PlanResult(strategy, *choose_schedules(problem, best[0]))


def _scheduled(
    problem: Problem, plan: Plan, schedules: list[tuple[str | None, int]], flip: bool
) -> list[Plan]:
    """`plan` with pipeline i on `schedules[i]` (V-placed ones reversed with `flip`), its
    micro-batch counts settled, and that re-balanced; [] where it cannot be done (or `flip`
    would reverse no pipeline)."""
    trial, flipped = plan, False
    for i, (name, chunks) in enumerate(schedules):
        if name is not None:
            spec, pipe = SCHEDULES[name], plan.pipelines[i]
            rev = flip and _flips(problem, spec, pipe)[-1]
            flipped |= rev
            pipe = _chunked(problem, plan, pipe, spec, chunks, "balanced", rev)
            if pipe is None:
                return []
            trial = _with_pipeline(trial, i, pipe)
    if flip and not flipped:
        return []
    trial = _settle(problem, trial, [p.num_micro_batches for p in trial.pipelines])
    if trial is None:
        return []
    again = _rebalanced(problem, trial)
    return [trial] if again is None else [trial, again]
