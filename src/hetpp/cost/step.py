"""Cost of one training step of a Plan: per-stage compute and memory, block-wise sync, totals."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from hetpp.cost.comm import (
    allreduce_time_s,
    group_link,
    p2p_link,
    ring_pass_time_s,
    scalar_allreduce_time_s,
)
from hetpp.cost.compute import CostModel, LayerCosts
from hetpp.cost.fsdp import FsdpStep, fsdp_step
from hetpp.cost.memory import StageMemory, device_memory, in_flight_counts, stage_memory
from hetpp.cost.params import (
    ParamSums,
    replicated_params,
    stage_params,
    stepped_params,
    tied_copy_params,
)
from hetpp.cost.pipeline import pipeline_done_s, placed_stage_times
from hetpp.cost.sync import (
    finish_step,
    norm_end_s,
    optimizer_step_s,
    overlapped_step_s,
    run_buckets,
    state_bytes,
)
from hetpp.specs.cluster import Link
from hetpp.specs.errors import SpecError
from hetpp.specs.model import ModelSpec
from hetpp.specs.plan import (
    Estimate,
    GradBucket,
    PipelinePlan,
    Plan,
    StagePlan,
    gather_order,
    grad_buckets,
)


@dataclass(frozen=True)
class StageCost:
    pipeline: int
    stage: int
    device: int
    gpu: str
    layers: tuple[int, int]
    fwd_s: float
    """Forward seconds per micro-batch."""
    bwd_s: float
    """Backward seconds per micro-batch (with recomputation when on: under a split backward
    I and W together, each recomputing, `hetpp.cost.pipeline.backward_parts_s`)."""
    weight_s: float
    """Of `bwd_s`, the weight-grad part (W) a split-backward schedule runs apart
    (`hetpp.cost.pipeline.backward_parts_s`)."""
    send_s: float
    """One-way activation transfer to the next stage, per micro-batch (0 for the last)."""
    memory: StageMemory
    capacity_bytes: float
    done_s: float
    """When the stage's parameter gradients are final: its last backward (under a split
    backward, its last weight-grad action)."""
    tp: int = 1
    """The stage's tensor-parallel degree: each of its ranks holds 1/tp of its blocks."""

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.capacity_bytes


@dataclass(frozen=True)
class SyncBucket:
    """Gradient blocks with one owning stage per pipeline, all-reduced as one flat buffer
    (sharded: its reduce-scatter, or its parameters' all-gather in `StepCost.gathers`)."""

    owners: tuple[int, ...]
    blocks: tuple[tuple[int, int], ...]
    bytes: float
    ready_s: float
    start_s: float
    end_s: float
    stages: tuple[int, ...] = ()
    """The owning stage per pipeline (`GradBucket.stages`); empty for the tied embedding/head
    bucket and the all-gathers."""


@dataclass(frozen=True)
class StepCost:
    stages: Sequence[StageCost]
    """Every stage's cost, pipeline after pipeline (`PlacedStages`: built when first read)."""
    pipeline_time_s: tuple[float, ...]
    buckets: tuple[SyncBucket, ...]
    exposed_sync_s: float
    """Gradient sync after the slowest pipeline's end: the buckets, then the gradient norm's
    all-reduce over every device (`hetpp.cost.sync.finish_step`)."""
    optimizer_s: float
    iteration_time_s: float
    global_batch: int
    gathers: tuple[SyncBucket, ...] = ()
    """With optimizer sharding: each sharded bucket's all-gather of updated parameters, after
    its owners' optimizer steps (`bytes`: the parameters in the weights' dtype), in forward
    order; timed from the step's start like the rest, they run past the barrier into the next
    step's forward (`cost.sync.overlapped_step_s`), so they may end after `iteration_time_s`."""
    fits_known: bool | None = field(default=None, repr=False, compare=False)
    """`fits` where `step_cost` read it off its pipelines' memos (`plan_fits`); None: worked out
    from the stages."""

    @property
    def throughput_samples_per_s(self) -> float:
        return self.global_batch / self.iteration_time_s

    @property
    def fits(self) -> bool:
        """Every stage, and every device over the stages it runs, within its memory (a device
        of one stage holds just that stage's: only those of several are summed again)."""
        return stages_fit(self.stages) if self.fits_known is None else self.fits_known

    def estimate(self, search_time_s: float = 0.0) -> Estimate:
        return Estimate(
            iteration_time_s=self.iteration_time_s,
            throughput_samples_per_s=self.throughput_samples_per_s,
            pipeline_time_s=self.pipeline_time_s,
            search_time_s=search_time_s,
            exposed_sync_s=self.exposed_sync_s,
        )


class StageHold(NamedTuple):
    """What memory a stage's device holds for it, without its times (`plan_fits`)."""

    device: int
    memory: StageMemory
    capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.capacity_bytes


def stages_fit(stages: Sequence[StageCost | StageHold]) -> bool:
    """Every stage, and every device over the stages it runs, within its memory (a device of
    one stage holds just that stage's: only those of several are summed again)."""
    if not all(s.fits for s in stages):
        return False
    runs = Counter(s.device for s in stages)
    shared = [s for s in stages if runs[s.device] > 1]
    return all(m.total <= cap for m, cap in device_memories(shared).values())


def plan_fits(plan: Plan, cm: CostModel) -> bool:
    """`step_cost(plan, cm).fits` without the pipelines' times or the sync: memory does not
    depend on them, and a planner trial that does not fit need not be timed (the action graph
    is most of a multi-chunk pipeline's cost). Pipeline by pipeline (a device runs in one
    pipeline only), memoized as `_pipeline_costs` is. Not for fully sharded plans."""
    _same_unit(plan, cm)
    memo, shards = cm.pipeline_memo, plan.optimizer_shards
    for pipe in plan.pipelines:
        same = memo.get(("fits", id(pipe), shards))
        if same is None or same[0] is not pipe:  # the entry holds the pipeline: ids stay
            same = memo[("fits", id(pipe), shards)] = (pipe, _pipeline_memory(cm, pipe, shards)[1])
        if not same[1]:
            return False
    return True


def pipeline_bound(pipe: PipelinePlan, cm: CostModel, shards: int) -> float | None:
    """The time of `pipe` in a plan sharded `shards` ways, or None where it does not fit: what
    `plan_fits` and `stage_costs` say of it, for a caller that changes one pipeline of a plan
    and can rule the plan out before building it (a step ends no earlier than any pipeline)."""
    if not _pipeline_memory(cm, pipe, shards)[1]:
        return None
    return _pipeline_costs(cm, pipe, shards).time_s


def overfilled_devices(plan: Plan, cm: CostModel) -> set[int]:
    """The devices whose stages of `plan` overfill them, from memory alone (as `plan_fits`;
    not for fully sharded plans)."""
    shards = plan.optimizer_shards
    holds = [
        StageHold(st.device, *row)
        for pipe in plan.pipelines
        for st, row in zip(pipe.stages, _pipeline_memory(cm, pipe, shards)[0])
    ]
    return {d for d, (m, cap) in device_memories(holds).items() if m.total > cap}


def cost_model_for_plan(plan: Plan, profiles=None) -> CostModel:
    """CostModel for the model, settings and cluster a plan names."""
    if plan.cluster is None:
        raise SpecError(
            "the plan names no cluster; re-plan it or add a `cluster` key", field="cluster"
        )
    model = ModelSpec(config=plan.model, seq_len=plan.seq_len, dtype_bytes=plan.train.dtype_bytes)
    return CostModel(model, plan.train, plan.cluster, profiles)


def stage_layer_costs(
    cm: CostModel, st: StagePlan, mbs: int, recompute: bool | None = None
) -> LayerCosts:
    """Layer costs of one rank of a plan's stage: its GPU type, its TP degree over its group's
    own link, its recomputation flag unless `recompute` says otherwise."""
    recompute = st.recomputes(cm.train) if recompute is None else recompute
    link = group_link(cm.cluster, st.devices) if st.tp > 1 else None
    return cm.layer_costs(cm.cluster.gpu(st.device), mbs, recompute, st.tp, link)


def stage_costs(plan: Plan, cm: CostModel) -> tuple[list[StageCost], list[float]]:
    """Per-stage costs of every pipeline, and each pipeline's time (a fully sharded plan:
    each device's own time, `cost.fsdp`)."""
    if plan.sharding == "full":
        return _fsdp_stages(fsdp_step(plan, cm))
    kinds = pipeline_costs(plan, cm)
    return list(PlacedStages(plan.pipelines, kinds)), [k.time_s for k in kinds]


class KindCost(NamedTuple):
    """What a pipeline's stages cost apart from their device ids, shared by the pipelines of
    one kind (`_kind`): a large plan runs hundreds of pipelines of a few kinds, and the step's
    per-device sums are worked out once per kind (`step_cost`)."""

    rows: tuple[tuple, ...]
    """Per stage the `StageCost` fields from `gpu` to `done_s`."""
    time_s: float
    """The pipeline's time."""
    fwd_s: tuple[float, ...]
    """Per stage `StageCost.fwd_s`."""
    bwd_s: tuple[float, ...]
    """Per stage `StageCost.bwd_s`."""
    weight_s: tuple[float, ...]
    """Per stage `StageCost.weight_s`."""
    send_s: tuple[float, ...]
    """Per stage `StageCost.send_s`."""
    done_s: tuple[float, ...]
    """Per stage `StageCost.done_s`."""
    starts_s: tuple[float, ...]
    """Per stage when its first forward starts if nothing waits (`first_forwards`)."""
    slots: tuple[tuple[int, ...], ...]
    """Per device of the pipeline (`PipelinePlan.devices` order) the stages it runs."""
    free_s: tuple[float, ...]
    """Per device (`slots`) when it finishes its last backward (`_done_per_device`)."""
    optimizer_s: tuple[float, ...]
    """Per device (`slots`) its optimizer step (`device_optimizer_time_s`)."""


class PlacedStages(Sequence[StageCost]):
    """A costed plan's `StageCost`s, pipeline after pipeline, built when first read: the
    search ranks most plans by their times alone."""

    def __init__(self, pipelines: Sequence[PipelinePlan], kinds: Sequence[KindCost]) -> None:
        self._pipelines, self._kinds = pipelines, kinds
        self._stages: tuple[StageCost, ...] | None = None

    def _all(self) -> tuple[StageCost, ...]:
        if self._stages is None:
            self._stages = tuple(
                StageCost(p, s, st.device, *row, st.tp)
                for p, (pipe, k) in enumerate(zip(self._pipelines, self._kinds))
                for s, (st, row) in enumerate(zip(pipe.stages, k.rows))
            )
        return self._stages

    def __getitem__(self, i):
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self):
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PlacedStages):
            return self._all() == other._all()
        return isinstance(other, tuple) and self._all() == other

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


def pipeline_costs(plan: Plan, cm: CostModel) -> list[KindCost]:
    """Each pipeline's `KindCost` (not for fully sharded plans); twins share one object."""
    return [_pipeline_costs(cm, pipe, plan.optimizer_shards) for pipe in plan.pipelines]


PIPELINE_MEMO = 1 << 17
"""Entries a CostModel's pipeline memo holds before it is cleared (`_pipeline_costs`; a new
pipeline takes about four: its cost by identity, its kind, its memory verdict, and a new kind
its cost): the planner costs many plans that share most of their pipelines (the schedule pass
changes a few at a time). At 16384 the 8192-GPU search of `bench/search_speed.py` cleared it 15
times (43.6 s CPU, peak RSS 251 MB, against 34.8 s and 477 MB at this size; branch speed5)."""


def _pipeline_costs(cm: CostModel, pipe: PipelinePlan, shards: int) -> KindCost:
    """The cost of `pipe` in a plan whose optimizer state is sharded `shards` ways; memoized on
    the cost model by its kind (`_kind`), by the pipeline itself with a TP stage."""
    memo = cm.pipeline_memo
    if len(memo) >= PIPELINE_MEMO:
        memo.clear()
    # By identity first: plans built from one another share their pipeline objects, and
    # hashing a pipeline or its kind costs more than the rest of a hit. The entry holds the
    # pipeline, so its id is not reused while the entry lives.
    same = memo.get(("cost of", id(pipe), shards))
    if same is not None and same[0] is pipe:
        return same[1]
    key = _kind(cm, pipe, shards) or ("tp pipeline", pipe, shards)
    got = memo.get(key)
    if got is None:
        got = memo[key] = _pipeline_rows(cm, pipe, shards)
    memo[("cost of", id(pipe), shards)] = (pipe, got)
    return got


def _kind(cm: CostModel, pipe: PipelinePlan, shards: int) -> tuple | None:
    """What `_pipeline_rows` reads of a pipeline: per stage its GPU type, layers and flags, the
    links between stages, which hand-overs stay on one device, the schedule and batch. None
    with a TP stage (its layer costs depend on its group's own link)."""
    same = cm.pipeline_memo.get(("kind of", id(pipe), shards))
    if same is not None and same[0] is pipe:  # asked by `plan_fits` and `_pipeline_costs`
        return same[1]
    kind = _new_kind(cm, pipe, shards)
    cm.pipeline_memo[("kind of", id(pipe), shards)] = (pipe, kind)  # holds it: ids stay
    return kind


def _new_kind(cm: CostModel, pipe: PipelinePlan, shards: int) -> tuple | None:
    if pipe.has_tp:
        return None
    devices = tuple(x.devices[0] for x in pipe.stages)  # `StagePlan.device`, inlined
    placed = cm.pipeline_memo.get(("devices", devices))
    if placed is None:  # what the devices decide, the same for every count and schedule
        cl, pairs = cm.cluster, list(itertools.pairwise(devices))
        placed = cm.pipeline_memo[("devices", devices)] = (
            tuple(cl.gpu(d).name.lower() for d in devices),
            tuple(p2p_link(cl, a, b) for a, b in pairs),
            _slots(devices),
        )
    names, links, slots = placed
    return (
        "kind",
        tuple((n, x.layers, x.recompute) for n, x in zip(names, pipe.stages)),
        links,
        slots,
        pipe.schedule,
        pipe.micro_batch_size,
        pipe.num_micro_batches,
        shards,
    )


def _slots(devices: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Per distinct device of `devices` (in first-stage order) the indexes of its stages."""
    slots: dict[int, list[int]] = {}
    for s, d in enumerate(devices):
        slots.setdefault(d, []).append(s)
    return tuple(map(tuple, slots.values()))


def _pipeline_rows(cm: CostModel, pipe: PipelinePlan, shards: int) -> KindCost:
    """A pipeline's `KindCost`."""
    cluster, train = cm.cluster, cm.train
    costs = _stage_layer_costs(cm, pipe)
    bounds = [pipe.stages[0].layers[0], *(st.layers[1] for st in pipe.stages)]
    links = [p2p_link(cluster, a.device, b.device) for a, b in zip(pipe.stages, pipe.stages[1:])]
    schedule = pipe.schedule_in(train)
    devices = [st.device for st in pipe.stages]
    fwd, bwd, comm, weight = placed_stage_times(
        costs, bounds, links, devices, schedule.splits_backward
    )
    d_count, m = len(pipe.devices), pipe.num_micro_batches
    total, done = pipeline_done_s(fwd, bwd, comm, m, schedule.name, d_count, weight)
    memory, _ = _pipeline_memory(cm, pipe, shards)
    send = [*comm, 0.0]
    rows = tuple(
        (costs[s].gpu.name, st.layers, fwd[s], bwd[s], weight[s], send[s], *memory[s], done[s])
        for s, st in enumerate(pipe.stages)
    )
    starts, at = [], 0.0
    for f, c in zip(fwd, send):
        starts.append(at)
        at += f + c
    slots = _slots(devices)
    free = [max(done[s] for s in slot) for slot in slots]  # each device's last backward
    opt = tuple(
        device_optimizer_time_s(cm, [pipe.stages[s] for s in slot], shards) for slot in slots
    )
    return KindCost(
        rows, total, *map(tuple, (fwd, bwd, weight, send, done, starts)), slots, tuple(free), opt
    )


def _stage_layer_costs(cm: CostModel, pipe: PipelinePlan) -> list[LayerCosts]:
    return [stage_layer_costs(cm, st, pipe.micro_batch_size) for st in pipe.stages]


def _pipeline_memory(
    cm: CostModel, pipe: PipelinePlan, shards: int
) -> tuple[tuple[tuple[StageMemory, float], ...], bool]:
    """Per stage of a pipeline its memory and its device's capacity, and whether the pipeline
    fits (`stages_fit`); memoized on the cost model by the pipeline's kind (`_kind`), or by the
    pipeline itself with a TP stage."""
    kind = _kind(cm, pipe, shards)
    key = ("memory", kind or pipe)
    got = cm.pipeline_memo.get(key)
    if got is None:
        costs = _stage_layer_costs(cm, pipe)
        schedule = pipe.schedule_in(cm.train)
        num, d_count, m = len(pipe.stages), len(pipe.devices), pipe.num_micro_batches
        layers = [st.layers for st in pipe.stages]
        in_flight = in_flight_counts(schedule, m, d_count, costs, layers)
        rows = tuple(
            (
                stage_memory(
                    cm.model, cm.train, c, *span, k, m, shards, schedule, (s, num, d_count), pending
                ),
                c.gpu.memory_bytes,
            )
            for s, (c, span, (k, pending)) in enumerate(zip(costs, layers, in_flight))
        )
        fits = stages_fit([StageHold(st.device, *row) for st, row in zip(pipe.stages, rows)])
        got = cm.pipeline_memo[key] = (rows, fits)
    return got


def _fsdp_stages(step: FsdpStep) -> tuple[list[StageCost], list[float]]:
    """An FSDP device as a one-stage pipeline: per micro-batch compute at its own speed, done
    when the lock-step forward and backward end."""
    stages = [
        StageCost(
            pipeline=p,
            stage=0,
            device=d.device,
            gpu=d.costs.gpu.name,
            layers=(0, len(d.costs.fwd_s)),
            fwd_s=float(d.costs.fwd_s.sum()),
            bwd_s=float(d.costs.bwd_s.sum()),
            weight_s=0.0,  # FSDP runs whole backwards
            send_s=0.0,
            memory=d.memory,
            capacity_bytes=d.costs.gpu.memory_bytes,
            done_s=step.lockstep_s,
        )
        for p, d in enumerate(step.devices)
    ]
    return stages, [d.own_s for d in step.devices]


def device_memories(stages: Sequence[StageCost]) -> dict[int, tuple[StageMemory, float]]:
    """Per device: its memory over all the stages it runs, and its capacity."""
    by_device: dict[int, list[StageCost]] = {}
    for st in stages:
        by_device.setdefault(st.device, []).append(st)
    return {
        d: (device_memory([x.memory for x in own]), own[0].capacity_bytes)
        for d, own in by_device.items()
    }


def sync_buckets(plan: Plan, cm: CostModel, stages: list[StageCost]) -> list[SyncBucket]:
    """Block-wise all-reduce (sharded: reduce-scatter) in `grad_buckets` order, then the tied
    embedding/head bucket (`hetpp.cost.sync.run_buckets` times them)."""
    final = {(st.pipeline, st.stage): st.done_s for st in stages}
    # one chunk's bucket: final once its owning stage in every pipeline is (`grad_buckets`)
    ready = [max(final[p, s] for p, s in enumerate(b.stages)) for b, _ in _bucket_params(plan, cm)]
    return _sync(plan, cm, ready, _done_per_device(stages))[0]


def _sync(
    plan: Plan, cm: CostModel, ready_s: list[float], done: dict[int, float]
) -> tuple[list[SyncBucket], dict[int, float]]:
    """`sync_buckets` from each block bucket's ready time and each device's last backward
    (`done`), and when each device is free of its buckets (`run_buckets`: as the latest end
    of its buckets, which run one after the other)."""
    grad = cm.train.grad_bytes_per_param
    order, ready = [], list(ready_s)
    for bucket, n in _bucket_params(plan, cm):
        owners, seconds = bucket.owners, _ring_s(plan, cm, bucket.owners, n * grad)
        order.append((owners, bucket.blocks, n * grad, seconds, bucket.stages))
    tied = _tied_holders(plan, cm)
    if tied:
        n = tied_copy_params(cm.model) * grad
        seconds = allreduce_time_s(n, len(tied), group_link(cm.cluster, tied))
        order.append((tied, (), n, seconds, ()))
        ready.append(max(done[o] for o in tied))
    durations = [(owners, seconds) for owners, _, _, seconds, _ in order]
    times, free = run_buckets(durations, done, ready)
    out = [
        SyncBucket(owners, blocks, nbytes, ready, start, end, own)
        for (owners, blocks, nbytes, _, own), (ready, start, end) in zip(order, times)
    ]
    if tied:  # it waits for its holders' block buckets: ready once they are free of them
        out[-1] = replace(out[-1], ready_s=out[-1].start_s)
    return out, free


def _bucket_params(plan: Plan, cm: CostModel) -> list[tuple[GradBucket, float]]:
    """Every bucket (`grad_buckets` order) and the parameters whose gradients one owner's rank
    sums. Owners of a TP stage stand for their group: each rank sums its shard with the matching
    shards of the other pipelines, in parallel, so a bucket takes as long as the owner with the
    least TP degree needs for its share (`ParamSums.synced`)."""
    same = cm.pipeline_memo.get(("buckets", id(plan)))
    if same is not None and same[0] is plan:  # the sync and the gathers both ask
        return same[1]
    sums = ParamSums(cm.model)
    # TP stages by lead device (a large plan has none: every owner's degree is 1)
    tp = {
        s.devices[0]: len(s.devices) for p in plan.pipelines for s in p.stages if len(s.devices) > 1
    }
    got = [
        (b, sum(sums.synced(x, y, _least_tp(tp, b.owners)) for x, y in b.blocks))
        for b in grad_buckets(plan)
    ]
    cm.pipeline_memo[("buckets", id(plan))] = (plan, got)
    return got


def _least_tp(tp: dict[int, int], owners: tuple[int, ...]) -> int:
    """The least TP degree of a bucket's owners (`tp`: the degree of each TP stage's lead)."""
    return min(tp.get(o, 1) for o in owners) if tp else 1


def _ring_s(plan: Plan, cm: CostModel, owners: tuple[int, ...], nbytes: float) -> float:
    """A bucket's gradient sum: a ring all-reduce, or with sharding one reduce-scatter pass."""
    link, ranks = _owners_link(cm, owners)
    if plan.sharding == "optimizer":
        return ring_pass_time_s(nbytes, ranks, link)
    return allreduce_time_s(nbytes, ranks, link)


def _owners_link(cm: CostModel, owners: tuple[int, ...]) -> tuple[Link, int]:
    """A bucket's ring (`group_link`) and its rank count; memoized on the cost model by the
    owners (a large plan's trials share most of their buckets' owner sets, thousands of devices
    long)."""
    key = ("ring", owners)
    got = cm.pipeline_memo.get(key)
    if got is None:
        got = cm.pipeline_memo[key] = (group_link(cm.cluster, owners), len(set(owners)))
    return got


def gathers(
    plan: Plan, cm: CostModel
) -> list[tuple[tuple[int, ...], tuple, float, float, tuple[int, ...]]]:
    """Sharded plans: each bucket's all-gather of its updated parameters (weights' dtype), as
    (owners, blocks, bytes, seconds, owning stage per pipeline), in forward order (first layers
    first, `specs.plan.gather_order`: the next step's forward needs them in that order, and the
    runtime issues them so on every rank); buckets with one owner need none."""
    if plan.optimizer_shards == 1:
        return []
    out = []
    for bucket, n in gather_order(_bucket_params(plan, cm), lambda b: b[0].blocks):
        owners, nbytes = bucket.owners, n * cm.train.dtype_bytes
        link, ranks = _owners_link(cm, owners)
        seconds = ring_pass_time_s(nbytes, ranks, link)
        out.append((owners, bucket.blocks, nbytes, seconds, bucket.stages))
    return out


def first_forwards(
    plan: Plan, kinds: Sequence[KindCost], stage_gathers: Sequence[tuple[int, ...]]
) -> list[tuple[int, float, list[int]]]:
    """Per stage, what `cost.sync.overlapped_step_s` reads: (device, when its first forward
    starts if nothing waits, the gathers it needs: those of the buckets it owns, by their
    owning stage per pipeline in `stage_gathers`). The start is the first micro-batch's way to
    it (the forwards and hops of the stages before): a device running several stages may start
    a later one later still, so this is the earliest, which keeps the bound an upper one.
    Stages of one pipeline per kind only: a twin's stage has the same start, needs the same
    gathers (the same layers) and waits for an optimizer step as long, so its release comes
    as late after its start, and the step's bound, their largest, is the same."""
    ones = one_of_each(kinds)
    needs: dict[tuple[int, int], list[int]] = {}
    for i, own in enumerate(stage_gathers):
        for p in ones:
            needs.setdefault((p, own[p]), []).append(i)
    return [
        (st.device, kinds[p].starts_s[s], needs.get((p, s), []))
        for p in ones
        for s, st in enumerate(plan.pipelines[p].stages)
    ]


def one_of_each(kinds: Sequence[KindCost]) -> list[int]:
    """The first pipeline of each kind, in pipeline order (twins share their `KindCost`)."""
    first: dict[int, int] = {}
    for p, k in enumerate(kinds):
        first.setdefault(id(k), p)
    return list(first.values())


def norm_allreduce_s(cm: CostModel, devices: tuple[int, ...]) -> float:
    """The gradient norm's all-reduce over a plan's `devices` (`cost.sync.finish_step`; a TP
    stage's group counts as its one device here: the tree's depth hardly moves)."""
    link, ranks = _owners_link(cm, devices)
    return scalar_allreduce_time_s(ranks, link)


def _tied_holders(plan: Plan, cm: CostModel) -> tuple[int, ...]:
    """Tied embedding/head: the ranks holding either copy also sum that matrix's gradient
    (none when untied, or when every pipeline has one stage: the block all-reduce of layer 0
    then covers the one copy per pipeline)."""
    if tied_copy_params(cm.model) == 0 or all(len(p.stages) == 1 for p in plan.pipelines):
        return ()
    ends = {p.stages[0].device for p in plan.pipelines} | {
        p.stages[-1].device for p in plan.pipelines
    }
    return tuple(sorted(ends))


def _same_unit(plan: Plan, cm: CostModel) -> None:
    """A plan's layer ranges index its own layer list: costed with a model cut at the other
    unit (`ModelConfig.layer_unit`) they would read the wrong layers."""
    if plan.model.layer_unit != cm.model.config.layer_unit:
        raise ValueError(
            f"a plan on {plan.model.layer_unit} units costed with a {cm.model.config.layer_unit}"
            "-unit cost model (planner: `Problem.on_unit(plan.model.layer_unit)`)"
        )


def step_cost(plan: Plan, cm: CostModel) -> StepCost:
    """Full cost of one step of `plan`."""
    _same_unit(plan, cm)
    if plan.sharding == "full":  # the reduce-scatters run inside the backward: no buckets
        fsdp = fsdp_step(plan, cm)
        stages, times = _fsdp_stages(fsdp)
        opt = max(d.optimizer_s for d in fsdp.devices)
        return StepCost(
            tuple(stages),
            tuple(times),
            (),
            fsdp.exposed_comm_s,
            opt,
            fsdp.iteration_time_s,
            plan.global_batch,
        )
    kinds = pipeline_costs(plan, cm)
    times = [k.time_s for k in kinds]
    done, pipe_end, opt = _per_device(plan, kinds)
    ones = one_of_each(kinds)
    ready = [  # twins' owning stages are final at the same time: one of each kind
        max(kinds[p].done_s[b.stages[p]] for p in ones) for b, _ in _bucket_params(plan, cm)
    ]
    buckets, end = _sync(plan, cm, ready, done)
    norm_s = norm_allreduce_s(cm, tuple(sorted(end)))
    norm_end = norm_end_s(end, pipe_end, norm_s)
    order = gathers(plan, cm)
    if order:  # overlapped with the next step's forward (`cost.sync.overlapped_step_s`)
        tail = [(o, sec) for o, _, _, sec, _ in order]
        firsts = first_forwards(plan, kinds, [own for *_, own in order])
        iteration, gathered = overlapped_step_s(norm_end, opt, tail, firsts)
        gathered = [tuple(norm_end + x for x in t) for t in gathered]
    else:
        _, done = finish_step(end, pipe_end, opt, norm_s=norm_s)
        iteration, gathered = max(done.values()), []
    return StepCost(
        PlacedStages(plan.pipelines, kinds),
        tuple(times),
        tuple(buckets),
        max(0.0, norm_end - max(times)),
        max(opt.values()),
        iteration,
        plan.global_batch,
        tuple(
            SyncBucket(owners, blocks, nbytes, *t)
            for (owners, blocks, nbytes, _, _), t in zip(order, gathered)
        ),
        plan_fits(plan, cm),
    )


def _per_device(
    plan: Plan, kinds: Sequence[KindCost]
) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """Per device of a plan (a device runs in one pipeline): when it finishes its last
    backward, when its pipeline ends, and its optimizer step, read off its pipeline's kind."""
    done, pipe_end, opt = {}, {}, {}
    for pipe, k in zip(plan.pipelines, kinds):
        for slot, free, step_s in zip(k.slots, k.free_s, k.optimizer_s):
            d = pipe.stages[slot[0]].device
            done[d], pipe_end[d], opt[d] = free, k.time_s, step_s
    return done, pipe_end, opt


def _done_per_device(stages: Sequence[StageCost]) -> dict[int, float]:
    """When each device finishes its last backward (its latest stage's)."""
    done: dict[int, float] = {}
    for s in stages:
        done[s.device] = max(done.get(s.device, 0.0), s.done_s)
    return done


def device_optimizer_time_s(
    cm: CostModel, stages: Sequence[StageCost | StagePlan], shards: int = 1
) -> float:
    """The optimizer step of one device over the stages it runs
    (`hetpp.cost.sync.optimizer_step_s`) and the parameters it steps: with `shards` owners per
    bucket, its shard of each (`stepped_params`)."""
    stepped = 0.0
    for st in stages:
        a, b = st.layers
        n = stage_params(cm.model, a, b, st.tp)
        stepped += stepped_params(n, replicated_params(cm.model, a, b), shards)
    bw = cm.cluster.gpu(stages[0].device).mem_bw_bytes_per_s
    return optimizer_step_s(state_bytes(stepped, cm.train), bw)
