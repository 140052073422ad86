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
from dataclasses import replace

from hetpp.cost.memory import device_memory, most_micro_batches, stage_memory
from hetpp.cost.pipeline import fill_and_beat, pipeline_done_s, steady_time_s, weight_grad_s
from hetpp.cost.step import stage_layer_costs
from hetpp.planner.assemble import PlanResult, build_plan, evaluate, layout_pipes
from hetpp.planner.problem import Problem
from hetpp.planner.recompute import drop_unneeded_recompute
from hetpp.planner.schedules import (
    CHUNK_COUNTS,
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

BUBBLE_SHARE = 0.005
"""`best_variant` skips a template whose one-chunk time at its share is within this share of
the bubble-free time (each micro-batch its busiest device's work): no schedule gains more."""


def best_variant(ctx: ShapeContext, t: TemplateCost, share: int) -> tuple[TemplateCost, Variant]:
    """The row a count DP should rank `t` by, and what it is: `t` itself, or `t` priced under
    the multi-chunk schedule that runs `share` micro-batches fastest if one beats it there.

    The price is cheap, not exact: each device keeps its work per micro-batch (as the pass's
    re-split aims), dealt evenly over its chunks in the schedule's placement; a hop between
    stages on the same device is free, the loop's wrap-around hop costs the template's slowest
    one; fill and beat by the schedule's timing rule; fewest micro-batches of the chunked
    shape; the one-chunk memory cap (`build_scheduled` checks memory in full)."""
    own: tuple[TemplateCost, Variant] = (t, (t, None, 1))
    problem = ctx.problem
    work = [f + b for f, b in zip(t.fwd_s, t.bwd_s)]
    if t.time(max(share, t.lo)) <= (1 + BUBBLE_SHARE) * max(share, t.lo) * max(work):
        return own
    best, best_s = own, t.time(max(share, t.lo))
    num_devices = t.num_stages
    wrap = max(t.comm_s, default=0.0)
    for name in problem.schedules_to_try(ctx.recompute):
        spec = SCHEDULES[name]
        for chunks in CHUNK_COUNTS[spec.placement]:
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
            if got < best_s:
                best_s = got
                row = replace(t, fill_s=fill, beat_s=beat, lo=lo)
                best = (row, (t, name, chunks), (fwd, bwd, comm, weight, at))
    if best is own:
        return own
    row, variant, (fwd, bwd, comm, weight, at) = best
    if SCHEDULES[variant[1]].placement != "loop":
        # A V's re-split gives each device about its work in time (`schedules._chunked`), not
        # its layer count dealt over its chunks. Pricing its sync per chunk on the pass's own
        # cuts was exact on a 2-chunk V but cost 1.21x search CPU and changed no benchmark plan
        # (docs/benchmarks-planner.md, branch loose), so its one-chunk buckets stand in.
        return row, variant
    return _with_chunk_sync(row, variant, fwd, bwd, comm, weight, at, max(share, row.lo)), variant


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


def priced_variants(
    ctx: ShapeContext, t: TemplateCost
) -> list[tuple[TemplateCost, str | None, int]]:
    """`t` as it is, and as each multi-chunk schedule would run it, priced in full: fill, beat,
    fewest micro-batches and memory cap of the pipeline the schedule pass would re-split, at a
    representative placement (a plan of the one pipeline: milliseconds per template)."""
    out: list[tuple[TemplateCost, str | None, int]] = [(t, None, 1)]
    problem = ctx.problem
    if not problem.schedules_to_try(ctx.recompute):
        return out
    pipes = layout_pipes(problem, [(t, 1)])
    total = problem.micro_batches(ctx.mbs)
    if pipes is None:
        return out
    plan = build_plan(problem, ctx.recompute, ctx.mbs, pipes, "hpp", [total])
    if plan is None:
        return out
    for name in problem.schedules_to_try(ctx.recompute):
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
            s = evaluate(problem, cand)
            if s.fits and (best is None or s.iteration_time_s < best[1]):
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
