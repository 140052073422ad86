"""Cost of one training step of a Plan: per-stage compute and memory, block-wise sync, totals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from hetpp.cost.comm import allreduce_time_s, group_link, p2p_link
from hetpp.cost.compute import CostModel
from hetpp.cost.memory import StageMemory, device_memory, stage_memory
from hetpp.cost.params import tied_copy_params
from hetpp.cost.pipeline import backward_done_s, pipeline_time_s, stage_times, weight_grad_s
from hetpp.cost.sync import optimizer_step_s, run_buckets, step_end_s
from hetpp.specs.errors import SpecError
from hetpp.specs.model import ModelSpec
from hetpp.specs.plan import Estimate, Plan, grad_buckets


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
    """Backward seconds per micro-batch (with recomputation when on)."""
    weight_s: float
    """Of `bwd_s`, the weight-grad part (W) a split-backward schedule runs apart
    (`hetpp.cost.pipeline.weight_grad_s`)."""
    send_s: float
    """One-way activation transfer to the next stage, per micro-batch (0 for the last)."""
    memory: StageMemory
    capacity_bytes: float
    done_s: float
    """When the stage finishes its last backward."""

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.capacity_bytes


@dataclass(frozen=True)
class SyncBucket:
    """Gradient blocks with one owner set, all-reduced as one flat buffer."""

    owners: tuple[int, ...]
    blocks: tuple[tuple[int, int], ...]
    bytes: float
    ready_s: float
    start_s: float
    end_s: float


@dataclass(frozen=True)
class StepCost:
    stages: tuple[StageCost, ...]
    pipeline_time_s: tuple[float, ...]
    buckets: tuple[SyncBucket, ...]
    exposed_sync_s: float
    optimizer_s: float
    iteration_time_s: float
    global_batch: int

    @property
    def throughput_samples_per_s(self) -> float:
        return self.global_batch / self.iteration_time_s

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages) and all(
            m.total <= cap for m, cap in device_memories(self.stages).values()
        )

    def estimate(self, search_time_s: float = 0.0) -> Estimate:
        return Estimate(
            iteration_time_s=self.iteration_time_s,
            throughput_samples_per_s=self.throughput_samples_per_s,
            pipeline_time_s=self.pipeline_time_s,
            search_time_s=search_time_s,
            exposed_sync_s=self.exposed_sync_s,
        )


def cost_model_for_plan(plan: Plan, profiles=None) -> CostModel:
    """CostModel for the model, settings and cluster a plan names."""
    if plan.cluster is None:
        raise SpecError(
            "the plan names no cluster; re-plan it or add a `cluster` key", field="cluster"
        )
    model = ModelSpec(config=plan.model, seq_len=plan.seq_len, dtype_bytes=plan.train.dtype_bytes)
    return CostModel(model, plan.train, plan.cluster, profiles)


def stage_costs(plan: Plan, cm: CostModel) -> tuple[list[StageCost], list[float]]:
    """Per-stage costs of every pipeline, and each pipeline's time."""
    cluster, train = cm.cluster, cm.train
    stages, times = [], []
    for p, pipe in enumerate(plan.pipelines):
        costs = [
            cm.layer_costs(cluster.gpu(st.device), pipe.micro_batch_size, st.recomputes(train))
            for st in pipe.stages
        ]
        bounds = [pipe.stages[0].layers[0], *(st.layers[1] for st in pipe.stages)]
        links = [
            p2p_link(cluster, a.device, b.device) for a, b in zip(pipe.stages, pipe.stages[1:])
        ]
        fwd, bwd, comm = stage_times(costs, bounds, links)
        # two stages on one device (a V's turn) hand over in memory
        comm = [0.0 if a.device == b.device else c
                for a, b, c in zip(pipe.stages, pipe.stages[1:], comm)]  # fmt: skip
        weight = [
            weight_grad_s(b, f if st.recomputes(train) else 0.0)
            for f, b, st in zip(fwd, bwd, pipe.stages)
        ]
        schedule = pipe.schedule_in(train)
        num, d_count = len(pipe.stages), len(pipe.devices)
        total = pipeline_time_s(
            fwd, bwd, comm, pipe.num_micro_batches, schedule.name, d_count, weight
        )
        done = backward_done_s(bwd, comm, total)
        if schedule.splits_backward:  # deferred weight-grads end every device late
            done = [total] * num
        for s, st in enumerate(pipe.stages):
            k = schedule.in_flight(s, num, pipe.num_micro_batches, d_count)
            mem = stage_memory(cm.model, train, costs[s], *st.layers, k)
            stages.append(
                StageCost(
                    p,
                    s,
                    st.device,
                    costs[s].gpu.name,
                    st.layers,
                    fwd[s],
                    bwd[s],
                    weight[s],
                    comm[s] if s < len(comm) else 0.0,
                    mem,
                    costs[s].gpu.memory_bytes,
                    done[s],
                )
            )
        times.append(total)
    return stages, times


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
    """Block-wise all-reduce in `grad_buckets` order, then the tied embedding/head bucket
    (`hetpp.cost.sync.run_buckets` times them)."""
    grad = cm.train.grad_bytes_per_param
    order = [
        (owners, tuple(blocks), sum(sum(x.params for x in cm.model.layers[a:b]) for a, b in blocks))
        for owners, blocks in grad_buckets(plan)
    ]
    tied = _tied_holders(plan, cm)
    if tied:
        order.append((tied, (), tied_copy_params(cm.model)))
    durations = [
        (owners, allreduce_time_s(n * grad, len(set(owners)), group_link(cm.cluster, owners)))
        for owners, _, n in order
    ]
    times, _ = run_buckets(durations, _done_per_device(stages))
    out = [
        SyncBucket(owners, blocks, n * grad, ready, start, end)
        for (owners, blocks, n), (ready, start, end) in zip(order, times)
    ]
    if tied:  # it waits for its holders' block buckets: ready once they are free of them
        out[-1] = replace(out[-1], ready_s=out[-1].start_s)
    return out


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


def step_cost(plan: Plan, cm: CostModel) -> StepCost:
    """Full cost of one step of `plan`."""
    stages, times = stage_costs(plan, cm)
    buckets = sync_buckets(plan, cm, stages)
    end = _done_per_device(stages)
    pipe_end = {s.device: times[s.pipeline] for s in stages}
    for b in buckets:
        for o in b.owners:
            end[o] = max(end[o], b.end_s)
    opt = {d: device_optimizer_time_s(cm, [s for s in stages if s.device == d]) for d in end}
    compute_end = max(times)
    sync_end = max(max(end[d], pipe_end[d]) for d in end)
    return StepCost(
        tuple(stages),
        tuple(times),
        tuple(buckets),
        max(0.0, sync_end - compute_end),
        max(opt.values()),
        step_end_s(end, pipe_end, opt),
        plan.global_batch,
    )


def _done_per_device(stages: Sequence[StageCost]) -> dict[int, float]:
    """When each device finishes its last backward (its latest stage's)."""
    done: dict[int, float] = {}
    for s in stages:
        done[s.device] = max(done.get(s.device, 0.0), s.done_s)
    return done


def device_optimizer_time_s(cm: CostModel, stages: Sequence[StageCost]) -> float:
    """The optimizer step of one device over the stages it runs
    (`hetpp.cost.sync.optimizer_step_s`)."""
    state = sum(s.memory.weights + s.memory.grads + s.memory.optimizer for s in stages)
    return optimizer_step_s(state, cm.cluster.gpu(stages[0].device).mem_bw_bytes_per_s)
