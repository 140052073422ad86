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

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from hetpp.cost.compute import CostModel
from hetpp.cost.step import StepCost, pipeline_bound, stage_layer_costs
from hetpp.planner.assemble import evaluate_below
from hetpp.planner.partition import balance_times, in_flight_per_stage, stage_tables
from hetpp.planner.problem import Problem
from hetpp.specs.plan import PipelinePlan, Plan

CLIMB_TRIALS = 64
"""Most single-layer cut moves `climb` costs per plan (each a full step cost where the moved
pipelines alone do not rule it out): a plan of few shapes settles in a few dozen."""

BUSY_SLACK = 1e-9
"""Share `_busy_bound_s` stays below its sum: the action graph adds a device's steps in its
own order (and a split backward as I + W), which can round a few ulps below any other order."""


def resplit_if_faster(
    problem: Problem, plan: Plan, step: StepCost, split: str = "balanced", rebalance: bool = True
) -> tuple[Plan, StepCost]:
    """`resplit(plan)` where it fits and is faster, then `climb`, then (with `rebalance`) the
    batch shared out again; then the multi-chunk shapes from whole-block counts (`chunksplit`)
    and, where that moved a cut, the climb and the batch again: the plan and its cost, `plan`
    and `step` where nothing helps. `chunksplit` comes last so that the climb's plan is the
    floor (run first it led the climb elsewhere: cloud-64 gpt3-1.3b 0.5877 -> 0.5884 s).
    `split` and `rebalance` are the strategy's freedom (`baselines.SCHEDULE_FREEDOM`): an
    equal-layer strategy keeps its split, one of equal batch shares its counts."""
    from hetpp.planner.chunksplit import chunksplit_if_faster  # it imports this module

    if split != "balanced" or plan.sharding == "full":
        return plan, step
    best = _faster(problem, resplit(problem, plan, rebalance), (plan, step))
    climbed = _climbed(problem, best, rebalance)
    split_again = chunksplit_if_faster(problem, *climbed)
    if split_again[1] is climbed[1]:
        return climbed
    return _climbed(problem, split_again, rebalance)


def _climbed(
    problem: Problem, best: tuple[Plan, StepCost], rebalance: bool
) -> tuple[Plan, StepCost]:
    """`climb` from `best`, then (with `rebalance`) the batch shared out again."""
    from hetpp.planner.mixed_mbs import shares  # mixed_mbs imports the schedule pass

    climbed = climb(problem, *best)
    if rebalance and climbed[1] is not best[1]:  # nothing moved: the batch is as it was
        climbed = _faster(problem, shares(problem, climbed[0]), climbed)
    return climbed


def _faster(
    problem: Problem, trial: Plan | None, best: tuple[Plan, StepCost]
) -> tuple[Plan, StepCost]:
    """`trial` and its cost where it fits and beats `best`, else `best`."""
    cost = None if trial is None else evaluate_below(problem, trial, best[1].iteration_time_s)
    if cost is not None and cost.fits and cost.iteration_time_s < best[1].iteration_time_s:
        return trial, cost
    return best


def climb(problem: Problem, plan: Plan, step: StepCost) -> tuple[Plan, StepCost]:
    """Single-layer cut moves under the full step cost, memory included, while one improves
    (the first found is taken; at most `CLIMB_TRIALS` tried): identical pipelines move
    together. The DP balances a one-chunk split's busiest stage at the fewest micro-batches;
    the step also sees the schedule's fill and beat, memory at the plan's micro-batch counts
    and, for multi-chunk pipelines, the device's chunks together (mixed-8 llama2-7b on zbv:
    an A100 with 12 blocks and an RTX 4090 with 4, where 11 and 5 fit and run 2.3% faster)."""
    best = (plan, step)
    trials = 0
    moved = True
    while moved and trials < CLIMB_TRIALS:
        moved = False
        for pipe, build in _moves(problem, *best):
            if trials >= CLIMB_TRIALS:
                break
            trials += 1
            if not _may_beat(problem, best, pipe):
                continue
            got = _faster(problem, build(), best)
            if got is not best:
                best, moved = got, True
                break
    return best


def _may_beat(problem: Problem, best: tuple[Plan, StepCost], pipe: PipelinePlan) -> bool:
    """Whether a plan of `best`'s with its slowest shape moved to `pipe` could beat it: not
    where `pipe` overfills or alone takes as long as the step (`evaluate_below`'s own tests,
    read off the one moved pipeline before its identical copies are built: at 1024 GPUs the
    copies were most of the climb)."""
    plan, step = best
    cm = problem.cost_model(plan.train.recompute, shards=1)
    if _busy_bound_s(cm, pipe) >= step.iteration_time_s:
        return False
    time_s = pipeline_bound(pipe, cm, plan.optimizer_shards)
    return time_s is not None and time_s < step.iteration_time_s


def _busy_bound_s(cm: CostModel, pipe: PipelinePlan) -> float:
    """A lower bound on `pipe`'s time (`pipeline_bound`'s) from its layer costs alone: its
    busiest device runs every forward and backward of its stages one after another, m times.
    The action graph's longest path (multi-chunk and split-backward schedules, 1F1B off its
    line) holds each device's steps in a chain; 1F1B's and GPipe's lines, `fill + (m - 1) x
    beat`, have a fill of the whole traversal and a beat of at least any stage's f + b. It rules
    out a quarter of lab-64's climb moves before their memory replay and longest path."""
    work: dict[int, float] = {}
    for st in pipe.stages:
        costs = stage_layer_costs(cm, st, pipe.micro_batch_size)
        work[st.device] = work.get(st.device, 0.0) + costs.fwd(*st.layers) + costs.bwd(*st.layers)
    return pipe.num_micro_batches * max(work.values()) * (1 - BUSY_SLACK)


def _moves(
    problem: Problem, plan: Plan, step: StepCost
) -> Iterator[tuple[PipelinePlan, Callable[[], Plan]]]:
    """Each way of moving one cut of `plan`'s slowest pipeline shape (identical pipelines
    together) by one layer: the slowest pipeline moved, and how to build the plan with every
    member moved. Only that shape's moves can shorten the step before the batch is shared out
    again."""
    times = step.pipeline_time_s
    slowest = plan.pipelines[max(range(len(times)), key=times.__getitem__)]
    if slowest.has_tp:
        return
    key = (_shape(problem, plan, slowest), slowest.num_micro_batches)
    members = [
        i
        for i, pipe in enumerate(plan.pipelines)
        if (_shape(problem, plan, pipe), pipe.num_micro_batches) == key
    ]
    cuts = [slowest.stages[0].layers[0]] + [st.layers[1] for st in slowest.stages]
    for j, d in itertools.product(range(1, len(cuts) - 1), (-1, 1)):
        new = list(cuts)
        new[j] += d
        if not new[j - 1] < new[j] < new[j + 1]:
            continue
        yield _recut(slowest, new), functools.partial(_built, plan, members, tuple(new))


def _recut(pipe: PipelinePlan, cuts: Sequence[int]) -> PipelinePlan:
    """`pipe` with its stages on `cuts`; a stage whose layers stay is kept, not copied (a
    climb move changes two stages of each member: at 1024 GPUs the copies were most of
    building a moved plan)."""
    spans = zip(pipe.stages, cuts, cuts[1:])
    moved = tuple(
        st if st.layers == (a, b) else st.model_copy(update={"layers": (a, b)})
        for st, a, b in spans
    )
    return pipe.model_copy(update={"stages": moved})


def _built(plan: Plan, members: list[int], cuts: tuple[int, ...]) -> Plan:
    """`plan` with each of `members` on `cuts`."""
    pipes = list(plan.pipelines)
    for i in members:
        pipes[i] = _recut(pipes[i], cuts)
    return plan.with_pipelines(pipes)


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
    trial = plan.with_pipelines(pipes)
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
