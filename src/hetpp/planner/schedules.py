"""Schedule and chunk count per pipeline: a pass over a strategy's best plan.

The search shapes pipelines (devices, splits, batch shares) under the plan's single-chunk
schedule. This pass then tries, pipeline by pipeline (slowest first), each multi-chunk schedule
the problem allows (`Problem.schedules_to_try`: with recomputation, none that splits
backward) at each chunk count it admits
(`CHUNK_COUNTS`): the pipeline's layers re-split over its `chunks x D` stages, placed as the
schedule says (loop: each device keeps its layer count, dealt over its chunks; V: each device
about its work), each device's memory shared by its chunks; its micro-batch count kept if the
schedule's torch class takes it. A
change is kept when the full step cost (`step_cost`, memory included) improves. Then, where the
strategy balances batch shares, data balance runs again on the new pipeline times (counts that
torch refuses are moved to the nearest accepted ones). Memory judges every candidate: a schedule
that holds more activations, or a split that does not fit, is never picked.

How each strategy may use it (so that comparisons stay fair): every strategy gets the same
schedules; a strategy keeps its own kind of split and batch: `split="balanced"` re-splits with
the stage-balance DP (hpp, layer-balanced), `split="equal"` deals the layers out equally over
the stages (uniform, data-balanced); `rebalance` is on only for strategies that balance batch
shares (hpp, data-balanced), so equal-batch baselines keep equal batches.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Literal

import numpy as np

from hetpp.cost.pipeline import fill_and_beat
from hetpp.cost.step import StepCost, device_memories, overfilled_devices, pipeline_costs
from hetpp.planner.assemble import evaluate, evaluate_below
from hetpp.planner.balance import PipelineGroup, allocate
from hetpp.planner.partition import (
    balance_stages,
    equal_bounds,
    in_flight_per_stage,
    stage_tables,
)
from hetpp.planner.problem import Problem
from hetpp.specs.plan import PipelinePlan, Plan, StagePlan
from hetpp.specs.schedule import SCHEDULES, ScheduleSpec
from hetpp.specs.trainspec import TrainSpec

Split = Literal["balanced", "equal"]
CHUNK_COUNTS = {"one": (1,), "loop": (2, 3, 4), "v": (2,)}
"""Chunk counts tried per placement (more chunks: a smaller bubble, more hops and memory). The
loop placement takes any count in torch; 3 and 4 win on lab-64 llama2-7b and dc-128's three rows
of `bench/planner.py` (docs/benchmarks-planner.md, "Loop-placed schedules at 3 and 4 chunks
per device")."""


def choose_schedules(
    problem: Problem, plan: Plan, split: Split = "balanced", rebalance: bool = True
) -> tuple[Plan, StepCost]:
    """`plan` with each pipeline on the fastest schedule the problem allows, and its cost."""
    best = first = evaluate(problem, plan)
    first_train = plan.train
    start = one_chunk = pass_start(plan)
    names = problem.schedules_to_try(start.train.recompute)
    if _sharded_pass_follows(problem, plan):
        names = tuple(n for n in names if SCHEDULES[n].placement != "one")
    if not names:
        return plan, best
    groups = shape_groups(problem, start)
    rc = plan.train.recompute
    # Pipelines of one shape move together: their cuts stay aligned, so the block-wise sync
    # keeps its buckets (one pipeline alone on other cuts would split every block it crosses).
    for members in sorted(groups.values(), key=lambda g: -best.pipeline_time_s[g[0]]):
        trials = group_trials(problem, start, members, names, split, best.iteration_time_s)
        for *_, trial in trials:
            if trial is None:
                continue
            trial, cost = _costed(problem, trial, best.iteration_time_s, rc)
            if _beats(cost, best):
                plan, best = trial, cost
        if best is not first:  # the next shape starts from what won
            start = plan
    # Every shape at once too: moving one shape alone re-cuts it against the others, which can
    # split the blocks of every bucket over a slow link, while all moved together keep theirs.
    if len(groups) > 1:
        for name in names:
            spec = SCHEDULES[name]
            for chunks in CHUNK_COUNTS[spec.placement]:
                trial = _all_chunked(problem, one_chunk, groups, spec, chunks, split)
                if trial is None:
                    continue
                trial, cost = _costed(problem, trial, best.iteration_time_s, rc)
                if _beats(cost, best):
                    plan, best = trial, cost
    if rebalance:
        trial = _rebalanced(problem, plan)
        if trial is not None:
            cost = evaluate_below(problem, trial, best.iteration_time_s)
            if _beats(cost, best):
                plan, best = trial, cost
    return _with_train(plan, first_train), best


TIE_REL = 1e-9
"""A trial replaces the pass's best only where it is faster by more than this share: a gain at
float rounding (a one-stage ZB-H1 pipeline at 1 ulp under its 1F1B, the same schedule with a
split backward) is a tie, and a tie keeps the plan the pass started from."""


def _beats(cost: StepCost | None, best: StepCost) -> bool:
    bound_s = best.iteration_time_s * (1 - TIE_REL)
    return cost is not None and cost.fits and cost.iteration_time_s < bound_s


def pass_start(plan: Plan) -> Plan:
    """`plan` as the pass tries it: recomputation as a per-stage flag (on where a stage of
    `plan` recomputes), none plan-wide, so a chunked trial's new stages start without it and
    get it only where a device overfills (`_costed`). With the plan-wide flag every stage of a
    trial recomputed and the split-backward schedules were not tried at all
    (`Problem.schedules_to_try`): edu-32 gpt3-13b, sharded, recomputed on none of its stages
    and on every one of its interleaved trial's."""
    if not plan.train.recompute:
        return plan
    train = plan.train.model_copy(update={"recompute": False})
    return _retrained(plan, train, lambda st: True if st.recomputes(plan.train) else None)


def _with_train(plan: Plan, train: TrainSpec) -> Plan:
    """`plan` (a trial from `pass_start`) under the plan-wide settings it started from, each
    stage's recomputation written out: the same cost, and the plan still says it was searched
    with recomputation."""
    if plan.train == train:
        return plan
    return _retrained(plan, train, lambda st: st.recomputes(plan.train))


def _retrained(plan: Plan, train: TrainSpec, recompute: Callable[[StagePlan], bool | None]) -> Plan:
    """`plan` under `train`, each stage's recomputation flag set to `recompute(stage)`."""
    pipes = tuple(
        p.model_copy(update={"stages": tuple(
            st.model_copy(update={"recompute": recompute(st)}) for st in p.stages)})
        for p in plan.pipelines
    )  # fmt: skip
    return plan.model_copy(update={"train": train, "pipelines": pipes})


def _costed(
    problem: Problem, trial: Plan, bound_s: float, may_recompute: bool
) -> tuple[Plan, StepCost | None]:
    """`trial` and its full cost (None if it does not fit or cannot beat `bound_s`:
    `evaluate_below`). Where it overfills and `may_recompute` (the plan was searched with
    recomputation), again with recomputation on every stage of each overfilled device, if none
    of them runs a split backward (torch's W would recompute each block once per parameter
    group: `Problem.schedules_to_try`)."""
    cost = evaluate_below(problem, trial, bound_s)
    if not may_recompute or (cost is not None and cost.fits):
        return trial, cost
    if cost is not None:  # a fully sharded plan is timed before its memory is judged
        over = {d for d, (m, cap) in device_memories(cost.stages).items() if m.total > cap}
    else:  # refused unfit before any timing, or by its bound (then nothing overfills)
        over = overfilled_devices(trial, problem.cost_model(trial.train.recompute, shards=1))
        if not over:
            return trial, None
    pipes = []
    for pipe in trial.pipelines:
        if not over.intersection(pipe.devices):
            pipes.append(pipe)
            continue
        if pipe.schedule_in(trial.train).splits_backward:
            return trial, cost
        stages = tuple(
            st.model_copy(update={"recompute": True}) if st.device in over else st
            for st in pipe.stages
        )
        pipes.append(pipe.model_copy(update={"stages": stages}))
    trial = trial.model_copy(update={"pipelines": tuple(pipes)})
    return trial, evaluate_below(problem, trial, bound_s)


def shape_groups(problem: Problem, plan: Plan) -> dict[tuple, list[int]]:
    """The plan's one-chunk pipelines by shape (`_shape`): the pass moves each group together."""
    groups: dict[tuple, list[int]] = {}
    for i, pipe in enumerate(plan.pipelines):
        if pipe.chunks == 1:
            groups.setdefault(_shape(problem, pipe), []).append(i)
    return groups


def group_trials(
    problem: Problem,
    start: Plan,
    members: list[int],
    names: tuple[str, ...],
    split: Split,
    bound_s: float = math.inf,
) -> Iterator[tuple[str, int, bool, bool, Plan | None]]:
    """Each trial of the pass for the pipelines `members` of `start` (one shape): schedule,
    chunks, whether the devices are reversed, whether thinned (`_thinned`; not where its
    micro-batches at its slowest stage's work already take `bound_s`), and the plan (None
    where the layers, micro-batch counts or torch's rules do not allow it)."""
    for name in names:
        spec = SCHEDULES[name]
        for chunks, flip in itertools.product(
            CHUNK_COUNTS[spec.placement], _flips(problem, spec, start.pipelines[members[0]])
        ):
            thin = [_thinned(problem, start, start.pipelines[i], chunks, split) for i in members]
            lean = (
                thin[0] is not None
                and thin[0][1] * start.pipelines[members[0]].num_micro_batches < bound_s
            )
            for thinned in (False, True)[: 1 + lean]:
                trial = start
                for i, got in zip(members, thin):
                    pipe = got[0] if thinned else start.pipelines[i]
                    pipe = _chunked(problem, start, pipe, spec, chunks, split, flip)
                    if pipe is None:
                        trial = None
                        break
                    trial = _with_pipeline(trial, i, pipe)
                if trial is not None:
                    counts = [p.num_micro_batches for p in trial.pipelines]
                    trial = _settle(problem, trial, counts)
                yield name, chunks, flip, thinned, trial


def _thinned(
    problem: Problem, plan: Plan, pipe: PipelinePlan, chunks: int, split: Split
) -> tuple[PipelinePlan, float] | None:
    """`pipe` without the devices holding fewer layers than `chunks`, its layers re-split
    over the rest by stage balance under the plan's one-chunk schedule (its memory rule), and
    its slowest stage's seconds per micro-batch; or None (no such device, fewer than two left,
    an equal split, or no split fits). The search gives a device one layer where that layer
    paces the pipeline or fills its memory: at `chunks` stages per device it must take a
    second layer, doubling its work (T4s beside H100s, V100s beside A100s: every 2-chunk trial
    of the 1F1B rows of cloud-64, edu-32, gen-32 and mega-1024 in `bench/planner.py`), so the
    trial also runs without them, leaving them idle.

    Not in an unsharded pass that the targeted ZeRO-1 pass follows (`sharding_mode`
    "targeted", two or more pipelines): a thinned unsharded win leaves that pass no one-chunk
    pipeline to start from, where its sharded trials can do better (lab-64 llama2-7b: 82.7
    against 83.0 samples/s). Thinned pipelines hold the left-out devices' states on fewer
    devices: sharding is what makes them fit (each gain in docs/benchmarks-planner.md)."""
    if _sharded_pass_follows(problem, plan):
        return None
    keep = [st.device for st in pipe.stages if st.layers[1] - st.layers[0] >= chunks]
    if split != "balanced" or len(keep) == len(pipe.stages) or len(keep) < 2:
        return None
    # memoized per shape on the cost model the cuts read, like `_chunked`'s cuts
    cm = problem.cost_model(plan.train.recompute, shards=plan.optimizer_shards)
    key = ("thinned", _shape(problem, pipe), chunks)
    if key not in cm.pipeline_memo:
        mbs, spec = pipe.micro_batch_size, pipe.schedule_in(plan.train)
        tables = [stage_tables(cm, cm.layer_costs(problem.cluster.gpu(d), mbs)) for d in keep]
        bounds = balance_stages(tables, in_flight_per_stage(spec, len(keep)))
        cm.pipeline_memo[key] = bounds and (
            bounds,
            max(float(t.time[a, b]) for t, (a, b) in zip(tables, itertools.pairwise(bounds))),
        )
    if cm.pipeline_memo[key] is None:
        return None
    bounds, slowest_s = cm.pipeline_memo[key]
    stages = tuple(_stage(d, a, b) for d, (a, b) in zip(keep, itertools.pairwise(bounds)))
    return pipe.model_copy(update={"stages": stages}), slowest_s


def _sharded_pass_follows(problem: Problem, plan: Plan) -> bool:
    """Whether the targeted ZeRO-1 pass (`sharding.sharded_schedule_pass`) runs the schedule
    pass again on `plan` sharded. There the unsharded pass leaves out what that pass does
    better: thinned trials (`_thinned`) and zbh1, whose every stage holds S micro-batches to
    their W, so sharding is what lets it fit. An unsharded zbh1 win on a baseline's plan hid
    hpp's own plan, which the targeted pass then never sharded (slowlink-256 gpt3-1.3b: 0.517 s
    where hpp's own sharded plan takes 0.414 s)."""
    return (
        problem.sharding_mode == "targeted" and plan.sharding == "none" and len(plan.pipelines) > 1
    )


def _all_chunked(
    problem: Problem,
    plan: Plan,
    groups: dict[tuple, list[int]],
    spec: ScheduleSpec,
    chunks: int,
    split: Split,
) -> Plan | None:
    """`plan` with every group of pipelines that can on `spec` at `chunks` chunks (the rest
    unchanged), its micro-batch counts settled; None if no group can or they cannot settle."""
    trial, moved = plan, False
    for members in groups.values():
        pipes = [_chunked(problem, plan, plan.pipelines[i], spec, chunks, split) for i in members]
        if all(pipes):
            for i, pipe in zip(members, pipes):
                trial = _with_pipeline(trial, i, pipe)
            moved = True
    if not moved:
        return None
    return _settle(problem, trial, [p.num_micro_batches for p in trial.pipelines])


def busiest_work_s(step: StepCost) -> list[float]:
    """Per pipeline of a costed plan: its busiest device's forward + backward seconds per
    micro-batch, over all the stages the device runs (what a bubble-free schedule paces at)."""
    work: dict[tuple[int, int], float] = {}
    for st in step.stages:
        key = (st.pipeline, st.device)
        work[key] = work.get(key, 0.0) + st.fwd_s + st.bwd_s
    busiest = [0.0] * len(step.pipeline_time_s)
    for (p, _), w in work.items():
        busiest[p] = max(busiest[p], w)
    return busiest


def pass_bound_s(plan: Plan, step: StepCost) -> float:
    """An optimistic step time for `plan` after the pass: every pipeline bubble-free (each
    micro-batch its busiest device's work), the batch re-balanced over them, no exposed sync,
    the same optimizer step. The search skips passes this says cannot win."""
    rate = sum(
        pipe.micro_batch_size / w for pipe, w in zip(plan.pipelines, busiest_work_s(step))
    )  # samples per second
    return plan.global_batch / rate + step.optimizer_s


def _shape(problem: Problem, pipe: PipelinePlan) -> tuple:
    """What makes two pipelines interchangeable here: GPU types, layers and batch share."""
    return (
        tuple((problem.cluster.gpu(st.device).name, st.layers) for st in pipe.stages),
        pipe.micro_batch_size,
        pipe.num_micro_batches,
    )


def _flips(problem: Problem, spec: ScheduleSpec, pipe: PipelinePlan) -> tuple[bool, ...]:
    """Device orders to try `pipe` in under `spec`: as searched, and reversed where that can
    differ (a V placement whose first and last devices differ in type): the V's first device
    runs the first and the last stage (embedding and head), so the type a one-chunk order puts
    last may lead it better (4 A100 + 4 RTX-4090: the A100 first)."""
    if spec.placement != "v":
        return (False,)
    first, last = (problem.cluster.gpu(pipe.devices[i]).name for i in (0, -1))
    return (False, True) if first != last else (False,)


def _with_pipeline(plan: Plan, i: int, pipe: PipelinePlan) -> Plan:
    pipes = list(plan.pipelines)
    pipes[i] = pipe
    return plan.with_pipelines(pipes)


def _chunked(
    problem: Problem,
    plan: Plan,
    pipe: PipelinePlan,
    spec: ScheduleSpec,
    chunks: int,
    split: Split,
    flip: bool = False,
) -> PipelinePlan | None:
    """`pipe`'s devices (in reverse order with `flip`) running `chunks` stages each under
    `spec`, or None if its layers, micro-batch count or memory do not allow it."""
    devices = pipe.devices[::-1] if flip else pipe.devices
    # The count and cuts depend on the pipeline's shape only: pipelines of one shape (a
    # trial moves them together) share them, memoized on the cost model the cuts read. The
    # pipeline itself is memoized with its devices: the trials and passes that place it alike
    # (mega-1024: 11798 calls, 6542 distinct) share one object, which the cost memos find by
    # identity (`cost.step._pipeline_costs`) without working out its kind again.
    memo = problem.cost_model(plan.train.recompute).pipeline_memo
    key = ("chunked", _shape(problem, pipe), len(devices), spec.name, chunks, split, flip)
    built = (key, tuple(devices))
    if built not in memo:
        placed = [devices[spec.device_index(s, len(devices))] for s in range(chunks * len(devices))]
        if key not in memo:
            memo[key] = _chunked_cuts(problem, plan, pipe, spec, chunks, split, placed)
        cuts = memo[key]
        memo[built] = None if cuts is None else _placed_pipeline(pipe, spec, placed, *cuts)
    return memo[built]


def _placed_pipeline(
    pipe: PipelinePlan, spec: ScheduleSpec, placed: list[int], m: int, bounds: tuple[int, ...]
) -> PipelinePlan:
    """`pipe`'s batch share as `m` micro-batches under `spec`, its stages cut at `bounds` on
    the devices `placed`."""
    stages = tuple(_stage(d, a, b) for d, (a, b) in zip(placed, itertools.pairwise(bounds)))
    return PipelinePlan(
        stages=stages, schedule=spec.name, micro_batch_size=pipe.micro_batch_size,
        num_micro_batches=m,
    )  # fmt: skip


@lru_cache(maxsize=1 << 16)
def _stage(device: int, start: int, end: int) -> StagePlan:
    """A one-device stage; frozen, so shared by every trial that places it alike (schedules of
    one placement, the pass's runs on plans with common pipelines): validating each anew was
    most of a trial's re-split."""
    return StagePlan(devices=(device,), layers=(start, end))


def _chunked_cuts(
    problem: Problem,
    plan: Plan,
    pipe: PipelinePlan,
    spec: ScheduleSpec,
    chunks: int,
    split: Split,
    placed: list[int],
) -> tuple[int, tuple[int, ...]] | None:
    """`_chunked`'s micro-batch count and cuts for `pipe` (its stages on `placed`), or None."""
    num_devices, m = len(pipe.devices), pipe.num_micro_batches
    num = len(placed)
    while m > 1 and spec.micro_batch_problem(num, num_devices, m):
        m -= 1  # the nearest count torch takes; `_settle` hands the rest to other pipelines
    if num > problem.layer_list_len or spec.micro_batch_problem(num, num_devices, m):
        return None
    if split == "balanced":
        bounds = _kept_counts_bounds(pipe, spec, chunks) or _proportional_bounds(
            problem, plan, pipe, placed, chunks
        )
        if bounds is None:
            return None
    else:
        bounds = equal_bounds(problem.layer_list_len, num)
    return m, bounds


def _kept_counts_bounds(
    pipe: PipelinePlan, spec: ScheduleSpec, chunks: int
) -> tuple[int, ...] | None:
    """Loop placement: each device keeps as many layers as it has in `pipe`, dealt over its
    chunks as evenly as they go (the earlier chunks take the odd ones), so every device's work
    per micro-batch, and the first and last layers' devices, stay what the search balanced
    (a time share per chunk would round 3 layers to 2 or 4 at 2 chunks; one stage per device,
    zbh1: `pipe`'s own cuts). A device with fewer layers than chunks (the embedding alone, say)
    takes the missing ones from the device with the most. None for the V placement (its last
    stage is on the first device) or fewer layers than stages."""
    counts = [st.layers[1] - st.layers[0] for st in pipe.stages]
    if spec.placement == "v" or sum(counts) < chunks * len(counts):
        return None
    for d in range(len(counts)):
        while counts[d] < chunks:
            counts[max(range(len(counts)), key=counts.__getitem__)] -= 1
            counts[d] += 1
    return _dealt(pipe.stages[0].layers[0], counts, chunks)


def _dealt(start: int, counts: list[int], chunks: int) -> tuple[int, ...]:
    """Loop-placed cuts from `start` with `counts[d]` layers on device d, dealt over its
    chunks as evenly as they go, the earlier chunks taking the odd ones."""
    per_stage = [n // chunks + (c < n % chunks) for c in range(chunks) for n in counts]
    return tuple(itertools.accumulate(per_stage, initial=start))


def _proportional_bounds(
    problem: Problem, plan: Plan, pipe: PipelinePlan, placed: list[int], chunks: int
) -> tuple[int, ...] | None:
    """Cuts giving each device about its work in `pipe` (the search's stage balance) over its
    chunks (`proportional_cuts`)."""
    cm = problem.cost_model(plan.train.recompute)
    mbs = pipe.micro_batch_size
    cum = {d: _cum_time(cm, problem.cluster.gpu(d), mbs) for d in pipe.devices}
    work = {st.device: cum[st.device][st.layers[1]] - cum[st.device][st.layers[0]]
            for st in pipe.stages}  # fmt: skip
    return proportional_cuts(cum, work, placed, chunks, problem.layer_list_len)


def proportional_cuts(
    cum: Mapping[Hashable, np.ndarray],
    work: Mapping[Hashable, float],
    placed: Sequence[Hashable],
    chunks: int,
    end: int,
) -> tuple[int, ...] | None:
    """Cuts of layers [0, end) over the stages on devices `placed` (each device `chunks`
    times), device d's cumulative forward + backward seconds over the layers `cum[d]`, its work
    to place `work[d]`: walking the stages in order, a stage takes layers on its own device
    while that brings its time nearer the device's work still to place over its chunks still to
    come, leaving a layer for each later stage (None when the layers run out first). Aiming at
    what is left, not a fixed `1 / chunks` share, lets a later chunk make up for an earlier
    one's rounding. The V placement's re-split; `variants` prices a V's sync on these cuts."""
    left, to_come = dict(work), dict.fromkeys(work, chunks)
    num = len(placed)
    cuts = [0]
    for s, d in enumerate(placed[:-1]):
        share = left[d] / to_come[d]
        a, b = cuts[-1], cuts[-1] + 1
        last = end - (num - s - 1)  # leave a layer for every later stage
        while b < last and abs(cum[d][b + 1] - cum[d][a] - share) <= abs(
            cum[d][b] - cum[d][a] - share
        ):
            b += 1
        if b > last:
            return None
        cuts.append(b)
        left[d] -= cum[d][b] - cum[d][a]
        to_come[d] -= 1
    return (*cuts, end)


def _cum_time(cm, gpu, mbs: int):
    """Cumulative forward + backward seconds over the layer list on one GPU type."""
    costs = cm.layer_costs(gpu, mbs)
    return costs.fwd_cum + costs.bwd_cum


def _rebalanced(problem: Problem, plan: Plan) -> Plan | None:
    """Data balance again over the plan's pipelines as they now run (None if it cannot)."""
    groups = _groups(problem, plan)
    if groups is None:
        return None
    got = allocate(groups, problem.micro_batches(plan.pipelines[0].micro_batch_size))
    return None if got is None else _settle(problem, plan, [ms[0] for ms in got[1]], groups)


def _groups(problem: Problem, plan: Plan) -> list[PipelineGroup] | None:
    """Each pipeline's closed-form line as data balance reads it (None if memory caps one)."""
    kinds = pipeline_costs(plan, problem.cost_model(plan.train.recompute, shards=1))
    total = problem.micro_batches(plan.pipelines[0].micro_batch_size)
    groups = []
    lines: dict[tuple, tuple[float, float]] = {}  # pipelines of one kind share their line
    for pipe, kind in zip(plan.pipelines, kinds):
        spec = pipe.schedule_in(plan.train)
        if not spec.bounded_in_flight:
            return None  # memory caps its micro-batches: the search's shares stand
        times = (kind.fwd_s, kind.bwd_s, kind.send_s, kind.weight_s)
        key = (spec.name, len(kind.slots), times)
        if key not in lines:
            fwd, bwd, send, weight = times
            lines[key] = fill_and_beat(
                [*fwd], [*bwd], [*send[:-1]], spec.name, len(kind.slots), [*weight]
            )
        fill, beat = lines[key]
        groups.append(PipelineGroup(fill, beat, spec.min_micro_batches(len(pipe.stages)), total))
    return groups


def _settle(
    problem: Problem, plan: Plan, counts: list[int], groups: list[PipelineGroup] | None = None
) -> Plan | None:
    """`plan` with these micro-batch counts, each that torch refuses lowered to the nearest it
    takes and what they leave of the global batch given one at a time to the pipeline that
    then finishes first (and takes it; the lowest index on ties); None if that cannot be done.
    Pipelines of mixed micro-batch sizes (`mixed_mbs`) take `counts` as they are or not at all:
    handing out micro-batches of one size counted the wrong samples (mega-1024 gpt3-1.3b's
    targeted pass re-balanced 4096 samples of sizes 2 and 4 into 3072)."""
    shapes = [_run_shape(plan, pipe) for pipe in plan.pipelines]
    if len({pipe.micro_batch_size for pipe in plan.pipelines}) > 1:
        samples = sum(pipe.micro_batch_size * m for pipe, m in zip(plan.pipelines, counts))
        fine = samples == plan.global_batch and all(_runs(*x, m) for x, m in zip(shapes, counts))
        return _with_counts(problem, plan, counts) if fine else None
    total = problem.micro_batches(plan.pipelines[0].micro_batch_size)
    if sum(counts) == total and all(_runs(*x, m) for x, m in zip(shapes, counts)):
        return _with_counts(problem, plan, counts)
    groups = groups or _groups(problem, plan)
    if groups is None:
        return None
    counts = list(counts)
    for i, x in enumerate(shapes):
        while counts[i] > groups[i].lo and not _runs(*x, counts[i]):
            counts[i] -= 1
        if not _runs(*x, counts[i]):
            return None
    # Only the pipeline that takes one changes: a heap of the takers by (time with one more,
    # index) picks what a scan of all of them would.
    heap = [(groups[i].time(m + 1), i) for i, m in enumerate(counts) if _runs(*shapes[i], m + 1)]
    heapq.heapify(heap)
    for _ in range(total - sum(counts)):
        if not heap:
            return None
        _, i = heapq.heappop(heap)
        counts[i] += 1
        if _runs(*shapes[i], counts[i] + 1):
            heapq.heappush(heap, (groups[i].time(counts[i] + 1), i))
    return _with_counts(problem, plan, counts)


def _run_shape(plan: Plan, pipe: PipelinePlan) -> tuple[str, int, int]:
    """What `_runs` reads of a pipeline: its schedule, stage count and device count."""
    return pipe.schedule or plan.train.schedule, len(pipe.stages), len(pipe.devices)


@lru_cache(maxsize=65536)
def _runs(schedule: str, num_stages: int, num_devices: int, m: int) -> bool:
    """Whether a pipeline of this schedule and shape runs m micro-batches (asked for every
    pipeline of every trial)."""
    return SCHEDULES[schedule].micro_batch_problem(num_stages, num_devices, m) is None


def _with_counts(problem: Problem, plan: Plan, counts: list[int]) -> Plan:
    """`plan` with these micro-batch counts."""
    memo = problem.cost_model(plan.train.recompute).pipeline_memo
    pipes = tuple(
        p if p.num_micro_batches == m else _with_count(memo, p, m)
        for p, m in zip(plan.pipelines, counts)
    )
    return plan.with_pipelines(pipes)


def _with_count(memo: dict, pipe: PipelinePlan, m: int) -> PipelinePlan:
    """`pipe` at `m` micro-batches, one object per (pipeline object, count) in `memo` (a cost
    model's): the trials of one pass settle the same pipelines to the same counts again
    (mega-1024: 5964 copies, 3248 distinct), and the cost memos find a pipeline they have
    seen by identity. The entry holds `pipe`, so its id is not reused while it lives."""
    got = memo.get(("with count", id(pipe), m))
    if got is None or got[0] is not pipe:
        got = memo[("with count", id(pipe), m)] = (
            pipe,
            pipe.model_copy(update={"num_micro_batches": m}),
        )
    return got[1]
