"""Cost of one training step of a Plan: per-stage compute and memory, block-wise sync, totals."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hetpp.cost.comm import allreduce_time_s, group_link, p2p_link
from hetpp.cost.compute import CostModel, LayerCosts
from hetpp.cost.memory import StageMemory, stage_memory
from hetpp.cost.params import ParamSums, tied_copy_params
from hetpp.cost.pipeline import backward_done_s, pipeline_time_s, stage_times
from hetpp.cost.sync import optimizer_step_s, run_buckets, step_end_s
from hetpp.specs.errors import SpecError
from hetpp.specs.model import ModelSpec
from hetpp.specs.plan import Estimate, Plan, StagePlan, grad_buckets
from hetpp.specs.schedule import SCHEDULES


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
        return all(s.fits for s in self.stages)

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


def stage_layer_costs(
    cm: CostModel, st: StagePlan, mbs: int, recompute: bool | None = None
) -> LayerCosts:
    """Layer costs of one rank of a plan's stage: its GPU type, its TP degree over its group's
    own link, its recomputation flag unless `recompute` says otherwise."""
    recompute = st.recomputes(cm.train) if recompute is None else recompute
    link = group_link(cm.cluster, st.devices) if st.tp > 1 else None
    return cm.layer_costs(cm.cluster.gpu(st.device), mbs, recompute, st.tp, link)


def stage_costs(plan: Plan, cm: CostModel) -> tuple[list[StageCost], list[float]]:
    """Per-stage costs of every pipeline, and each pipeline's time."""
    cluster, train = cm.cluster, cm.train
    stages, times = [], []
    for p, pipe in enumerate(plan.pipelines):
        costs = [stage_layer_costs(cm, st, pipe.micro_batch_size) for st in pipe.stages]
        bounds = [pipe.stages[0].layers[0], *(st.layers[1] for st in pipe.stages)]
        links = [
            p2p_link(cluster, a.device, b.device) for a, b in zip(pipe.stages, pipe.stages[1:])
        ]
        fwd, bwd, comm = stage_times(costs, bounds, links)
        total = pipeline_time_s(fwd, bwd, comm, pipe.num_micro_batches, train.schedule)
        done = backward_done_s(bwd, comm, total)
        num = len(pipe.stages)
        for s, st in enumerate(pipe.stages):
            k = SCHEDULES[train.schedule].in_flight(s, num, pipe.num_micro_batches)
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
                    comm[s] if s < len(comm) else 0.0,
                    mem,
                    costs[s].gpu.memory_bytes,
                    done[s],
                )
            )
        times.append(total)
    return stages, times


def sync_buckets(plan: Plan, cm: CostModel, stages: list[StageCost]) -> list[SyncBucket]:
    """Block-wise all-reduce in `grad_buckets` order, then the tied embedding/head bucket
    (`hetpp.cost.sync.run_buckets` times them).

    Owners of a TP stage stand for their group: each rank all-reduces its shard with the
    matching shards of the other pipelines, in parallel, so a bucket takes as long as the
    owner with the least TP degree needs for its share (`ParamSums.synced`)."""
    grad = cm.train.grad_bytes_per_param
    sums = ParamSums(cm.model)
    tp = {s.device: s.tp for p in plan.pipelines for s in p.stages}
    order = [
        (
            owners,
            tuple(blocks),
            sum(sums.synced(a, b, min(tp[o] for o in owners)) for a, b in blocks),
        )
        for owners, blocks in grad_buckets(plan)
    ]
    tied = _tied_holders(plan, cm)
    if tied:
        order.append((tied, (), tied_copy_params(cm.model)))
    durations = [
        (owners, allreduce_time_s(n * grad, len(set(owners)), group_link(cm.cluster, owners)))
        for owners, _, n in order
    ]
    times, _ = run_buckets(durations, {s.device: s.done_s for s in stages})
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
    end = {s.device: s.done_s for s in stages}
    pipe_end = {s.device: times[s.pipeline] for s in stages}
    for b in buckets:
        for o in b.owners:
            end[o] = max(end[o], b.end_s)
    opt = {s.device: optimizer_time_s(cm, s) for s in stages}
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


def optimizer_time_s(cm: CostModel, stage: StageCost) -> float:
    """The optimizer step of one stage (`hetpp.cost.sync.optimizer_step_s`)."""
    m = stage.memory
    return optimizer_step_s(
        m.weights + m.grads + m.optimizer, cm.cluster.gpu(stage.device).mem_bw_bytes_per_s
    )
