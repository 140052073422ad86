"""Pipelines on the devices a plan leaves idle: a pass over hpp's final plan.

A type too slow to hold a layer beside the fast devices (a T4 block takes longer than an H100
stage of 16) and too small to hold the model in a pipeline of its own under 1F1B is left idle:
1F1B runs at least as many micro-batches as stages, and its first stage holds as many in
flight, so a pipeline of T4s deep enough for llama2-7b's states needs more micro-batches than
fit in the fast pipelines' step (gen-32 llama2-7b: 22 T4s at one sample, the step 3.1 s, each
micro-batch 2.2 s on one T4). GPipe takes any micro-batch count and holds that many: a few
micro-batches on a pipeline as shallow as its memory then allows can finish within the step.

This pass tries, per GPU type with unused devices (not tensor-parallel), k copies of a GPipe
pipeline over its unused devices (as deep as k copies make them, cut by stage balance under
GPipe's memory at m micro-batches), at each micro-batch size, running m micro-batches each;
the plan's own pipelines share the rest of the batch out again (`mixed_mbs.shares`). The step
gets shorter only if every pipeline that ends last gives up a micro-batch, so trials that take
fewer samples are not built. The few (k, m, size) whose closed-form time fits in the step the
batch then leaves, and that bring the slowest pipeline earlier, are costed by the
full step cost (gradient sync over the larger group, sharded state over more owners, memory)
and kept only where faster: never a slower plan than it was given.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hetpp.cost.step import StepCost
from hetpp.planner.assemble import evaluate_below, unused_devices
from hetpp.planner.mixed_mbs import shares
from hetpp.planner.partition import StageTables, balance_stages, stage_load, stage_tables
from hetpp.planner.problem import Problem
from hetpp.planner.schedules import _groups
from hetpp.specs.plan import PipelinePlan, Plan, StagePlan
from hetpp.specs.schedule import SCHEDULES

IDLE_SCHEDULE = "gpipe"
"""The idle pipelines' schedule: any micro-batch count, memory for as many in flight."""
IDLE_TRIALS = 3
"""Trials per plan, the most samples first, each shared out and, where its closed form can
shorten the step, costed in full."""


@dataclass(frozen=True)
class IdleTrial:
    """Copies of one GPipe pipeline on a type's unused devices, as the pass ranks them."""

    samples: int
    """Samples per step the copies take together (copies x micro-batches x size)."""
    time_s: float
    """One copy's closed-form time (fill + (m - 1) x slowest stage), seconds."""
    pipelines: tuple[PipelinePlan, ...]
    """The copies, each with its micro-batch count."""


def with_idle_pipelines(problem: Problem, plan: Plan, step: StepCost) -> tuple[Plan, StepCost]:
    """`plan` with GPipe pipelines added on its unused devices and the batch shared out again,
    where the full step cost says that is faster; else `plan` and `step`."""
    if plan.sharding == "full" or IDLE_SCHEDULE in {p.schedule for p in plan.pipelines}:
        return plan, step
    trials = sorted(_idle_trials(problem, plan, step), key=lambda t: -t.samples)
    best = (plan, step)
    for trial in trials[:IDLE_TRIALS]:
        got = _with_trial(problem, plan, trial, max(step.pipeline_time_s))
        cost = None if got is None else evaluate_below(problem, got, best[1].iteration_time_s)
        if cost is not None and cost.fits and cost.iteration_time_s < best[1].iteration_time_s:
            best = (got, cost)
    return best


def _with_trial(problem: Problem, plan: Plan, trial: IdleTrial, pipe_s: float) -> Plan | None:
    """`plan` with `trial`'s pipelines and the rest of the batch shared out over its own; None
    where that cannot be done or leaves the slowest pipeline, in closed form, no earlier than
    `pipe_s` (the step can then only get slower)."""
    train = plan.train.model_copy(update={"global_batch": plan.global_batch - trial.samples})
    shared = shares(problem, plan.model_copy(update={"train": train}))
    if shared is None:
        return None
    lines = _groups(problem, shared)
    rest_s = (g.time(p.num_micro_batches) for g, p in zip(lines, shared.pipelines))
    if max(trial.time_s, *rest_s) >= pipe_s:
        return None
    pipes = (*shared.pipelines, *trial.pipelines)
    return plan.model_copy(update={"pipelines": pipes, "grad_blocks": None})


def _idle_trials(problem: Problem, plan: Plan, step: StepCost) -> list[IdleTrial]:
    """Every (type, depth, size, micro-batch count) whose copies (as many as the type's unused
    devices make) fit in memory, take at least the samples the step's slowest pipelines must
    shed (`_to_shed`), and whose time stays within the step the plan's pipelines would take
    without their samples (the slowest pipeline's time scaled by the samples left)."""
    free = set(unused_devices(problem, plan))
    pipe_s, shed = max(step.pipeline_time_s), _to_shed(plan, step)
    out = []
    for pool in problem.pools.values():
        ids = [d for node in pool.nodes for d in node if d in free]
        if pool.tp > 1 or not ids:
            continue
        tables = {}  # the type's stage tables, per (micro-batch size, optimizer shards)
        cm = problem.cost_model(plan.train.recompute)
        for depth, mbs in itertools.product(range(1, len(ids) + 1), problem.micro_batch_sizes):
            copies = len(ids) // depth  # as many as the devices make: the same time, more samples
            costs = cm.layer_costs(pool.gpu, mbs)
            whole_s = costs.fwd_cum[-1] + costs.bwd_cum[-1]
            # time and memory grow with m: start at the fewest micro-batches that shed enough
            for m in itertools.count(-(-shed // (copies * mbs))):
                samples = copies * m * mbs
                limit_s = pipe_s * (1 - samples / plan.global_batch)
                # a pipeline's time is at least its whole model, plus (m - 1) x its mean stage
                if samples >= plan.global_batch or whole_s * (1 + (m - 1) / depth) >= limit_s:
                    break
                got = _copies(problem, plan, ids, copies, depth, mbs, m, tables)
                if got is None or got[1] >= limit_s:
                    break
                out.append(IdleTrial(samples, got[1], got[0]))
    return out


def _to_shed(plan: Plan, step: StepCost) -> int:
    """Samples the plan's pipelines must give up for the step to get shorter: a micro-batch of
    each pipeline that ends last (fewer leave one of them as late as before)."""
    last_s = max(step.pipeline_time_s)
    return sum(
        pipe.micro_batch_size
        for pipe, t in zip(plan.pipelines, step.pipeline_time_s)
        if t >= last_s * (1 - 1e-9)
    )


def _copies(
    problem: Problem,
    plan: Plan,
    ids: list[int],
    copies: int,
    depth: int,
    mbs: int,
    m: int,
    tables: dict[tuple[int, int], StageTables],
) -> tuple[tuple[PipelinePlan, ...], float] | None:
    """`copies` GPipe pipelines of `depth` devices of `ids` (in order), their layers cut by
    stage balance under GPipe's memory at `m` micro-batches, and one's closed-form time;
    None if no cut fits or there are fewer layers than stages. `tables` memoizes the type's
    stage tables per (micro-batch size, optimizer shards)."""
    if depth > problem.layer_list_len:
        return None
    shards = len(plan.pipelines) + copies if plan.sharding == "optimizer" else 1
    if (mbs, shards) not in tables:
        cm = problem.cost_model(plan.train.recompute, shards=shards)
        tables[mbs, shards] = stage_tables(cm, cm.layer_costs(problem.cluster.gpu(ids[0]), mbs))
    table, spec = tables[mbs, shards], SCHEDULES[IDLE_SCHEDULE]
    bounds = balance_stages([table] * depth, [stage_load(spec, s, depth, m) for s in range(depth)])
    if bounds is None:
        return None
    times = [float(table.time[a, b]) for a, b in itertools.pairwise(bounds)]
    pipes = tuple(
        PipelinePlan(
            stages=tuple(
                StagePlan(devices=(d,), layers=span)
                for d, span in zip(ids[c * depth : (c + 1) * depth], itertools.pairwise(bounds))
            ),
            schedule=IDLE_SCHEDULE,
            micro_batch_size=mbs,
            num_micro_batches=m,
        )
        for c in range(copies)
    )
    return pipes, sum(times) + (m - 1) * max(times)
