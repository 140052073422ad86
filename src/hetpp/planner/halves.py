"""Stage cuts at half blocks on a finished plan (`ModelConfig.layer_unit` half).

A stage holds whole blocks, so on a pipeline of two device speeds the best whole-block counts
can sit well above the balanced work (40 blocks over 8 A100s and 8 RTX 4090s: 14.6% on lab-64
gpt3-13b, `bench/imbalance.py`'s *granularity*). Cutting the layer list at each block's
attention and MLP halves doubles the places a stage may end, at no extra transfer: a boundary
mid-block sends the residual stream as one between blocks does.

`halves_if_faster` moves a plan to the half-unit layer list with its cuts unchanged (the same
step, costed again), then runs `resplit`'s stage DP and cut climb there; the result is kept where
it fits and the full step cost improves by `HALF_MIN_GAIN`. `with_half_blocks` is hpp's last
pass (`planner.plan`). Plans with tensor-parallel stages, FSDP plans and models with a parallel
residual (their halves read one input) stay at whole blocks.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from hetpp.cost.step import StepCost
from hetpp.planner.assemble import PlanResult, evaluate_below
from hetpp.planner.idle import joined_if_faster
from hetpp.planner.problem import Problem
from hetpp.planner.resplit import resplit_if_faster
from hetpp.planner.sharding import sharded_problem
from hetpp.specs.plan import PipelinePlan, Plan

HALF_MIN_GAIN = 0.005
"""The least share of the step a half-block plan must save over its whole-block one: a cut
mid-block costs what the model does not price (the attention half's memory-bound work is
priced at its FLOP share), not worth it for a rounding-size gain (0.16% on 2 A100 + 2 RTX
4090, gpt3-350m, batch 32; 0.06% and 0.30% on two plans of the pinned suite)."""


def in_halves(plan: Plan) -> Plan:
    """`plan` on the half-unit layer list, every stage boundary where it was (a block-unit
    boundary b is half-unit 2b - 1); gradient blocks derived again."""
    c = plan.model
    model = c.model_copy(update={"layer_unit": "half"})

    def moved(pipe: PipelinePlan) -> PipelinePlan:
        stages = tuple(
            st.model_copy(update={"layers": (c.in_halves(st.layers[0]), c.in_halves(st.layers[1]))})
            for st in pipe.stages
        )
        return pipe.model_copy(update={"stages": stages})

    pipes = tuple(moved(p) for p in plan.pipelines)
    return plan.with_pipelines(pipes, model=model)


def can_halve(plan: Plan) -> bool:
    """Whether `plan` may move to half blocks (module docstring)."""
    return (
        plan.model.layer_unit == "block"
        and not plan.model.parallel_residual
        and plan.sharding != "full"
        and not any(st.tp > 1 for p in plan.pipelines for st in p.stages)
    )


def halves_if_faster(problem: Problem, plan: Plan, step: StepCost) -> tuple[Plan, StepCost]:
    """`plan` re-split at half blocks where that fits and is faster by `HALF_MIN_GAIN`
    (`resplit_if_faster` on the half-unit problem), else `plan` and `step`."""
    if not can_halve(plan):
        return plan, step
    halved = problem.on_unit("half")
    moved = in_halves(plan)
    cost = evaluate_below(halved, moved, float("inf"))  # None: it does not fit
    if cost is None:
        return plan, step
    # a half block is what lets an unused small device take a stage of each V chunk
    got, got_step = resplit_if_faster(halved, *joined_if_faster(halved, moved, cost))
    if got_step.fits and got_step.iteration_time_s < (1 - HALF_MIN_GAIN) * step.iteration_time_s:
        return got, got_step
    return plan, step


HALVED = ("hpp", "exact")
"""The strategies whose plans get the half-block pass (the baselines and FSDP keep whole
blocks: their plan spaces; hpp may take a baseline's plan at half blocks, `with_half_blocks`)."""

BASELINE_REACH = 0.05
"""A baseline's plan among hpp's others gets the pass only where its whole-block step is within
this share above the best half-block step so far: each costs a re-split (up to 2 s CPU on
mega-1024 for uniform's, whose equal cuts never won), and on `bench/planner.py` the one that
wins, dc-128 gpt3-13b's layer-balanced plan, starts 4.7% above hpp's (docs/benchmarks-planner.md,
"Bubbles the pass could not remove")."""


def with_half_blocks(
    problem: Problem, result: PlanResult, time_limit_s: float | None = None
) -> PlanResult:
    """hpp's last pass, after every other (`planner.plan`; the exact reference's too): the plan
    of `result`, of any hpp result among `result.others` (where another family won
    `search_best`: its hpp plan may win once cut at half blocks), and, where `result` is hpp's,
    of the baselines' plans among its others (the plans it keeps to be never slower than a
    baseline: one that lost at whole blocks may win at half blocks, dc-128 gpt3-13b's
    layer-balanced ZB-V plan in `bench/planner.py`), re-split at half blocks where that is
    faster (`halves_if_faster`); the fastest, its time added to the search's. Each plan
    is costed as it was (a sharded plan in `sharding.sharded_problem`'s precision, TP searches
    at their all-ones degrees). Last, because the passes before it price a plan with the
    block-unit problem they were given. Skipped, and the note says so, once the search has
    taken `time_limit_s`."""
    ours = [r for r in (result, *result.others) if r.feasible and r.strategy in HALVED]
    theirs = [r for r in result.others if r.feasible and r.strategy not in HALVED]
    if result.strategy not in HALVED:  # FSDP won `best`: only its hpp plans may move
        theirs = []
    if not (ours or theirs) or not problem.half_blocks:
        return result
    if time_limit_s is not None and result.search_time_s > time_limit_s:
        why = "time limit reached: the half-block pass skipped"
        return replace(result, note="; ".join(x for x in (result.note, why) if x))
    t0 = time.perf_counter()
    base = replace(problem, tp_degrees={}, tp_search=False) if problem.tp_search else problem
    best, best_step, won = result.plan, result.step, result
    for i, r in enumerate([*ours, *sorted(theirs, key=lambda r: r.iteration_time_s)]):
        reach_s = (1 + BASELINE_REACH) * best_step.iteration_time_s
        if i >= len(ours) and r.iteration_time_s > reach_s:
            break  # the baselines' plans slowest last: none after this is within reach
        costed = sharded_problem(base) if r.plan.sharding == "optimizer" else base
        plan, step = halves_if_faster(costed, r.plan, r.step)
        # a baseline's plan cut at half blocks saves `HALF_MIN_GAIN` over the whole-block
        # plan it replaces, as hpp's own must (edu-32 llama2-7b's layer-balanced: 0.45%)
        floor_s = (1 - HALF_MIN_GAIN) * result.iteration_time_s if i >= len(ours) else math.inf
        if step.iteration_time_s < min(best_step.iteration_time_s, floor_s):
            best, best_step, won = plan, step, r
    took_s = result.search_time_s + time.perf_counter() - t0
    if won is result:
        return replace(result, plan=best, step=best_step, search_time_s=took_s)
    if won.strategy not in HALVED:  # a baseline's plan, which hpp takes as its own
        plan = best.model_copy(update={"strategy": result.plan.strategy})
        notes = [n for n in result.note.split("; ") if n and not n.endswith("best found")]
        notes.append(f"the {won.strategy} plan, at half blocks, was the best found")
        note = "; ".join(notes)
        return replace(result, plan=plan, step=best_step, search_time_s=took_s, note=note)
    others = tuple(r for r in (result, *result.others) if r is not won)
    return replace(won, plan=best, step=best_step, search_time_s=took_s, others=others)
