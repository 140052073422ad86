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

A type fast enough to take a stage beside the plan's devices but too small for a pipeline of its
own is left idle too: a T4 (16 GB) holds no llama2-7b pipeline beside a few H100s' step, yet one
block of it (two halves of a V-placed pipeline, one per chunk) takes less than the H100s'
stages do. `joined_if_faster` appends k unused devices of a type to each pipeline of one shape
(under the V placement after its last device, the turn: on gen-32 llama2-7b at half blocks
and micro-batch 2 that cost 2.982 s against 3.018 s after the first device at k = 1, 2.678
against 2.750 s at k = 5; otherwise before the last device, which holds the head), cuts the
layers over the longer pipeline by whole-layer counts balanced against each device's speed
(`chunksplit.ChunkLayout.counts`, each stage without the embedding or head taking a layer at
least; every stage at the plan's recomputation), and runs it at each micro-batch size that
divides the pipelines' share (a deeper pipeline keeps more micro-batches in flight on its fast
devices: gen-32 llama2-7b's H100s overfill at two samples with T4s added, and fit at one).
Each trial (the batch shared out again where other shapes remain) is kept only where the full
step cost improves and fits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hetpp.cost.step import StepCost
from hetpp.planner.assemble import evaluate_below, unused_devices
from hetpp.planner.chunksplit import ChunkLayout
from hetpp.planner.mixed_mbs import shares
from hetpp.planner.partition import StageTables, balance_stages, stage_load, stage_tables
from hetpp.planner.placement import take_runs
from hetpp.planner.problem import Problem
from hetpp.planner.resplit import _may_beat, _recut, _shape
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
    then with unused devices joined to its pipelines (`joined_if_faster`), where the full step
    cost says that is faster; else `plan` and `step`."""
    if plan.sharding == "full":
        return plan, step
    best = (plan, step)
    gpipe = IDLE_SCHEDULE in {p.schedule for p in plan.pipelines}
    trials = [] if gpipe else sorted(_idle_trials(problem, plan, step), key=lambda t: -t.samples)
    for trial in trials[:IDLE_TRIALS]:
        got = _with_trial(problem, plan, trial, max(step.pipeline_time_s))
        cost = None if got is None else evaluate_below(problem, got, best[1].iteration_time_s)
        if cost is not None and cost.fits and cost.iteration_time_s < best[1].iteration_time_s:
            best = (got, cost)
    return joined_if_faster(problem, *best)


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
    return plan.with_pipelines(pipes)


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


def joined_if_faster(problem: Problem, plan: Plan, step: StepCost) -> tuple[Plan, StepCost]:
    """`plan` with unused devices appended to the pipelines of one shape (the module
    docstring): the fastest trial that fits and beats `step`, else `plan` and `step`. Per shape,
    type and micro-batch size, the most devices per pipeline go first, down to the first trial
    that fits (more stages take more work off the others; fewer are tried only where memory or
    the busiest device rules the trial out)."""
    if plan.sharding == "full":
        return plan, step
    free = set(unused_devices(problem, plan))
    best = (plan, step)
    for members in _shapes(problem, plan) if free else ():
        pipe = plan.pipelines[members[0]]
        share = pipe.micro_batch_size * pipe.num_micro_batches
        sizes = sorted((b for b in problem.micro_batch_sizes if share % b == 0), reverse=True)
        for pool, mbs in itertools.product(problem.pools.values(), sizes):
            most = sum(d in free for node in pool.nodes for d in node) // len(members)
            for k in range(most if pool.tp == 1 else 0, 0, -1):
                trial = _joined(problem, plan, members, pool.nodes, free, k, mbs)
                # the joined pipelines alone (memory, their busiest device) rule most trials
                # out before the batch is shared out and the step costed
                if trial is None or not _may_beat(problem, best, trial.pipelines[members[0]]):
                    continue
                if len(members) < len(plan.pipelines):
                    trial = shares(problem, trial) or trial
                cost = evaluate_below(problem, trial, best[1].iteration_time_s)
                if cost is not None and cost.fits:
                    if cost.iteration_time_s < best[1].iteration_time_s:
                        best = (trial, cost)
                    break
    return best


def _shapes(problem: Problem, plan: Plan) -> list[list[int]]:
    """The indices of each shape's pipelines (identical stages' types, layers and
    recomputation, schedule, micro-batch size and count), pipelines with TP stages left out."""
    groups: dict[tuple, list[int]] = {}
    for i, pipe in enumerate(plan.pipelines):
        if not pipe.has_tp:
            key = (_shape(problem, plan, pipe), pipe.num_micro_batches)
            groups.setdefault(key, []).append(i)
    return list(groups.values())


def _joined(
    problem: Problem,
    plan: Plan,
    members: list[int],
    nodes: tuple[tuple[int, ...], ...],
    free: set[int],
    k: int,
    mbs: int,
) -> Plan | None:
    """`plan` with `k` of the `free` devices of one type (`nodes`) appended to each pipeline of
    `members` (one shape), all at micro-batch size `mbs` over the same share of the batch and
    cut again alike (`ChunkLayout.counts`); None where the devices, the layers or the
    schedule's micro-batch rule do not allow it."""
    runs = take_runs(nodes, free, [k] * len(members))
    first = plan.pipelines[members[0]]
    spec = first.schedule_in(plan.train)
    m = first.micro_batch_size * first.num_micro_batches // mbs
    num_devices = len(first.devices) + k
    num = first.chunks * num_devices
    if runs is None or num > problem.layer_list_len:
        return None
    if spec.micro_batch_problem(num, num_devices, m):
        return None
    pipes = list(plan.pipelines)
    for i, extra in zip(members, runs):
        old = pipes[i].devices
        # the V placement's last device holds the turn; the others' holds the head
        devices = [*old, *extra] if spec.placement == "v" else [*old[:-1], *extra, old[-1]]
        stages = tuple(
            StagePlan(devices=(devices[spec.device_index(s, num_devices)],), layers=(s, s + 1))
            for s in range(num)
        )
        pipes[i] = first.model_copy(
            update={"stages": stages, "micro_batch_size": mbs, "num_micro_batches": m}
        )
    layout = ChunkLayout.of(problem, plan, pipes[members[0]])
    counts = layout.counts()
    if counts is None:
        return None
    cuts = layout.cuts(counts, "time")
    for i in members:
        pipes[i] = _recut(pipes[i], cuts)
    return plan.with_pipelines(pipes)
