"""Cost of one training step of a Plan: per-stage compute and memory, block-wise sync, totals."""

from __future__ import annotations

from dataclasses import dataclass

from hetpp.cost.comm import allreduce_time_s, p2p_time_s
from hetpp.cost.compute import CostModel
from hetpp.cost.memory import StageMemory, in_flight, stage_memory
from hetpp.cost.pipeline import backward_done_s, pipeline_time_s
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


def stage_costs(plan: Plan, cm: CostModel) -> tuple[list[StageCost], list[float]]:
    """Per-stage costs of every pipeline, and each pipeline's time."""
    cluster, train = cm.cluster, cm.train
    stages, times = [], []
    for p, pipe in enumerate(plan.pipelines):
        costs = [
            cm.layer_costs(cluster.gpu(st.device), pipe.micro_batch_size, st.recomputes(train))
            for st in pipe.stages
        ]
        fwd = [c.fwd(*st.layers) for c, st in zip(costs, pipe.stages)]
        bwd = [c.bwd(*st.layers) for c, st in zip(costs, pipe.stages)]
        comm = [
            p2p_time_s(c.send_bytes[st.layers[1] - 1], cluster.link(st.device, nxt.device))
            for c, st, nxt in zip(costs, pipe.stages, pipe.stages[1:])
        ]
        total = pipeline_time_s(fwd, bwd, comm, pipe.num_micro_batches, train.schedule)
        done = backward_done_s(bwd, comm, total)
        num = len(pipe.stages)
        for s, st in enumerate(pipe.stages):
            k = in_flight(train.schedule, s, num, pipe.num_micro_batches)
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
    """Block-wise all-reduce in `grad_buckets` order, each bucket starting when all its owners
    are done with backward and free of earlier buckets."""
    done = {s.device: s.done_s for s in stages}
    grad = cm.train.grad_bytes_per_param
    free = dict(done)
    out = []
    for owners, blocks in grad_buckets(plan):
        nbytes = sum(sum(x.params for x in cm.model.layers[a:b]) for a, b in blocks) * grad
        ready = max(done[o] for o in owners)
        start = max(ready, *(free[o] for o in owners))
        end = start + allreduce_time_s(nbytes, len(set(owners)), cm.cluster.group_link(owners))
        for o in owners:
            free[o] = end
        out.append(SyncBucket(owners, tuple(blocks), nbytes, ready, start, end))
    tied = _tied_bucket(plan, cm, free)
    return out + ([tied] if tied else [])


def _tied_bucket(plan: Plan, cm: CostModel, free: dict[int, float]) -> SyncBucket | None:
    """Tied embedding/head: the ranks holding either copy also sum that matrix's gradient."""
    last = cm.model.layers[-1]
    if last.stored_params == last.params:
        return None
    holders = sorted(
        {p.stages[0].device for p in plan.pipelines} | {p.stages[-1].device for p in plan.pipelines}
    )
    if all(len(p.stages) == 1 for p in plan.pipelines):
        return None  # one copy per pipeline; the block all-reduce of layer 0 already covers it
    nbytes = (last.stored_params - last.params) * cm.train.grad_bytes_per_param
    start = max(free[d] for d in holders)
    end = start + allreduce_time_s(nbytes, len(holders), cm.cluster.group_link(holders))
    for d in holders:
        free[d] = end
    return SyncBucket(tuple(holders), (), nbytes, start, start, end)


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
    iteration = max(max(end[d], pipe_end[d]) + opt[d] for d in end)
    return StepCost(
        tuple(stages),
        tuple(times),
        tuple(buckets),
        max(0.0, sync_end - compute_end),
        max(opt.values()),
        iteration,
        plan.global_batch,
    )


def optimizer_time_s(cm: CostModel, stage: StageCost) -> float:
    """The optimizer reads and writes every state byte once: memory-bound."""
    m = stage.memory
    return 2 * (m.weights + m.grads + m.optimizer) / cm.cluster.gpu(stage.device).mem_bw_bytes_per_s
