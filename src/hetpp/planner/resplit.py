"""Stage balance again on a finished plan, under the plan's own memory.

The search splits a template's layers once, for the memory of its setting: unsharded, with
recomputation on every stage or on none. ZeRO-1 (`planner.sharding`, `targeted` mode) then
frees most of each owner's optimizer state without moving a cut, so a sharded plan keeps the
cuts an unsharded one needed: on edu-32 gpt3-13b its A100-40GB stages stay full at six blocks
while an A10 holds two blocks and the head and paces the pipeline; on cloud-64 gpt3-13b a T4
keeps a block the H100s now have room for.

`resplit` runs the stage DP (`partition.balance_times`) again on each one-chunk pipeline shape
(identical pipelines together, so their cuts and gradient buckets stay aligned), each stage's
range priced at its device without recomputation where that fits, else (where the problem
allows recomputation) with it, memory at the plan's optimizer sharding, and deals the batch out
again (`mixed_mbs.shares`). `resplit_if_faster` keeps the result only where the full step cost
improves and fits.
"""

from __future__ import annotations

import numpy as np

from hetpp.cost.step import StepCost
from hetpp.planner.assemble import evaluate_below
from hetpp.planner.partition import balance_times, in_flight_per_stage, stage_tables
from hetpp.planner.problem import Problem
from hetpp.specs.plan import PipelinePlan, Plan


def resplit_if_faster(
    problem: Problem, plan: Plan, step: StepCost, split: str = "balanced", rebalance: bool = True
) -> tuple[Plan, StepCost]:
    """`resplit(plan)` and its cost where it fits and is faster, else `plan` and `step`.
    `split` and `rebalance` are the strategy's freedom (`baselines.SCHEDULE_FREEDOM`): an
    equal-layer strategy keeps its split, one of equal batch shares its counts."""
    if split != "balanced":
        return plan, step
    trial = resplit(problem, plan, rebalance)
    cost = None if trial is None else evaluate_below(problem, trial, step.iteration_time_s)
    if cost is not None and cost.fits and cost.iteration_time_s < step.iteration_time_s:
        return trial, cost
    return plan, step


def resplit(problem: Problem, plan: Plan, rebalance: bool = True) -> Plan | None:
    """`plan` with every one-chunk pipeline shape's layers split again (the module docstring)
    and, with `rebalance`, its batch shared out again (`mixed_mbs.shares`); None where no cut
    moves or the batch cannot be shared out."""
    from hetpp.planner.mixed_mbs import shares  # mixed_mbs imports the schedule pass

    pipes = list(plan.pipelines)
    done: dict[tuple, PipelinePlan | None] = {}
    tables: dict[tuple, object] = {}
    for i, pipe in enumerate(pipes):
        if pipe.chunks > 1 or pipe.has_tp:
            continue
        key = _shape(problem, plan, pipe)
        if key not in done:
            done[key] = _split(problem, plan, pipe, tables)
        got = done[key]
        if got is not None and _shape(problem, plan, got) != key:
            # identical pipelines take the same cuts, each on its own devices
            stages = tuple(
                new.model_copy(update={"devices": old.devices})
                for new, old in zip(got.stages, pipe.stages)
            )
            pipes[i] = pipe.model_copy(update={"stages": stages})
    if pipes == list(plan.pipelines):
        return None
    trial = plan.model_copy(update={"pipelines": tuple(pipes), "grad_blocks": None})
    return shares(problem, trial) if rebalance else trial


def _shape(problem: Problem, plan: Plan, pipe: PipelinePlan) -> tuple:
    """What pipelines split alike share: GPU types, layers and recomputation per stage,
    schedule and micro-batch size."""
    return (
        tuple(
            (problem.cluster.gpu(st.device).name, st.layers, st.recomputes(plan.train))
            for st in pipe.stages
        ),
        pipe.schedule_in(plan.train).name,
        pipe.micro_batch_size,
    )


def _split(problem: Problem, plan: Plan, pipe: PipelinePlan, tables: dict) -> PipelinePlan | None:
    """One pipeline's stages split by the DP, recomputing only the stages that need it."""
    spec = pipe.schedule_in(plan.train)
    loads = in_flight_per_stage(spec, len(pipe.stages))
    may_recompute = True in problem.recompute_options()
    plain, again = [], []
    for st, load in zip(pipe.stages, loads):
        gpu = problem.cluster.gpu(st.device)
        for rc, out in ((False, plain), (True, again)) if may_recompute else ((False, plain),):
            key = (gpu.name, rc, pipe.micro_batch_size)
            if key not in tables:
                cm = problem.cost_model(rc, shards=plan.optimizer_shards)
                tables[key] = stage_tables(cm, cm.layer_costs(gpu, pipe.micro_batch_size))
            out.append(tables[key].masked_time(load))
    # a range's time without recomputation where it fits, else with it (never faster)
    times = [np.where(np.isfinite(p), p, a) for p, a in zip(plain, again)] if again else plain
    bounds = balance_times(times)
    if bounds is None:
        return None

    def flag(p: np.ndarray, a: int, b: int) -> bool | None:
        rc = not np.isfinite(p[a, b])
        return None if rc == plan.train.recompute else rc

    stages = tuple(
        st.model_copy(update={"layers": (a, b), "recompute": flag(p, a, b)})
        for st, p, a, b in zip(pipe.stages, plain, bounds, bounds[1:])
    )
    return pipe.model_copy(update={"stages": stages})
