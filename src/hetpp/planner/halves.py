"""Stage cuts at half blocks on a finished plan (`ModelConfig.layer_unit` half).

A stage holds whole blocks, so on a pipeline of two device speeds the best whole-block counts
can sit well above the balanced work (40 blocks over 8 A100s and 8 RTX 4090s: 14.6% on lab-64
gpt3-13b, `bench/imbalance.py`'s *granularity*). Cutting the layer list at each block's
attention and MLP halves doubles the places a stage may end, at no extra transfer: a boundary
mid-block sends the residual stream as one between blocks does.

`halves_if_faster` moves a plan to the half-unit layer list with its cuts unchanged (the same
step, costed again), then runs `resplit`'s stage DP and cut climb there; the result is kept where
the full step cost improves and fits. Plans with tensor-parallel stages, FSDP plans and models
with a parallel residual (their halves read one input) stay at whole blocks.
"""

from __future__ import annotations

from dataclasses import replace

from hetpp.cost.step import StepCost
from hetpp.planner.assemble import evaluate_below
from hetpp.planner.problem import Problem
from hetpp.planner.resplit import resplit_if_faster
from hetpp.specs.plan import PipelinePlan, Plan


def halved_problem(problem: Problem) -> Problem:
    """`problem` with its model's layer list cut at half blocks (one object per problem,
    `Problem.derived`, so the passes share its cost models' memos)."""
    got = problem.derived.get("halves")
    if got is None:
        got = problem.derived["halves"] = replace(problem, model=problem.model.with_unit("half"))
    return got


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
    return plan.model_copy(update={"model": model, "pipelines": pipes, "grad_blocks": None})


def can_halve(plan: Plan) -> bool:
    """Whether `plan` may move to half blocks (module docstring)."""
    return (
        plan.model.layer_unit == "block"
        and not plan.model.parallel_residual
        and plan.sharding != "full"
        and not any(st.tp > 1 for p in plan.pipelines for st in p.stages)
    )


def halves_if_faster(
    problem: Problem, plan: Plan, step: StepCost, split: str = "balanced", rebalance: bool = True
) -> tuple[Plan, StepCost]:
    """`plan` re-split at half blocks where that fits and is faster (`resplit_if_faster` on the
    half-unit problem), else `plan` and `step`. `split` and `rebalance` as there."""
    if split != "balanced" or not can_halve(plan):
        return plan, step
    halved = halved_problem(problem)
    moved = in_halves(plan)
    cost = evaluate_below(halved, moved, float("inf"))  # None: it does not fit
    if cost is None:
        return plan, step
    got, got_step = resplit_if_faster(halved, moved, cost, split, rebalance)
    if got_step.fits and got_step.iteration_time_s < step.iteration_time_s:
        return got, got_step
    return plan, step
