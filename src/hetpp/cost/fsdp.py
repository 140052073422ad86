"""Heterogeneous FSDP (a plan with `sharding: full`): one step's time and each device's memory.

Every device trains the whole model on its own batch share (its own micro-batch size, one
micro-batch count for all) while parameters, gradients and optimizer state are sharded over the
N devices, as FSDP2's `fully_shard` does. An FSDP **unit** is one entry of the layer list (the
embedding, each block, the head): its parameters are all-gathered before its forward, gathered
again before its backward (resharded after forward), and its gradients reduce-scattered after
its backward, each a ring collective over the slowest link of the devices (`cost.comm`).

Time. Prefetch overlaps the next unit's collectives with the current unit's compute: forward is
`ag[0] + sum_u max(f[u], ag[u+1])`, backward (units in reverse) the same with the next unit's
all-gather plus the previous unit's reduce-scatter in flight, then the last reduce-scatter.
Every collective waits for its slowest member, so the devices advance unit by unit in lock-step:
the step takes, per unit, the slowest device's compute against the unit's communication
(`lockstep_s`), at least the slowest device's own time (`own_s`). Then each device steps the
optimizer on its shard.

Memory. Persistent and sharded 1/N: per parameter the float32 parameter (the master weights;
in bf16/fp16 these are the 4 B of master copy inside `optimizer_bytes_per_param`, in fp32 the
weights themselves), its float32 gradient and Adam's m and v: 16 B of hetpp's 18 B in bf16
mixed precision. The other 2 B, the half-precision weights, exist only while gathered:
FSDP2's `MixedPrecisionPolicy` casts the shard at each all-gather. Unsharded and transient: two
units' gathered parameters (the one computing and the one prefetched) and one unit's full
gradient (in the parameter dtype, plus its copy in the reduce dtype). Activations: one
micro-batch in flight (micro-batches run one after the other), as `cost.memory` charges a
stage holding every layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetpp.cost.comm import allreduce_time_s, group_link
from hetpp.cost.compute import CostModel, LayerCosts
from hetpp.cost.memory import StageMemory, stage_memory
from hetpp.cost.sync import optimizer_step_s
from hetpp.specs.cluster import Link
from hetpp.specs.model import ModelSpec
from hetpp.specs.plan import Plan
from hetpp.specs.trainspec import TrainSpec

GATHERED_UNITS = 2
"""Units whose parameters are unsharded at once: the one computing and the one prefetched."""


def unit_params(model: ModelSpec) -> np.ndarray:
    """Parameters per FSDP unit (one per layer; a tied head shares the embedding's tensor, so
    its matrix is counted once, at the embedding)."""
    return np.array([x.params for x in model.layers], dtype=float)


def ring_gather_s(num_bytes: float | np.ndarray, num_ranks: int, link: Link) -> float | np.ndarray:
    """Ring all-gather (or reduce-scatter) of `num_bytes` in total over `num_ranks` ranks: half
    of a ring all-reduce, which is a reduce-scatter followed by an all-gather."""
    return allreduce_time_s(num_bytes, num_ranks, link) / 2


def unit_comm_s(
    model: ModelSpec, train: TrainSpec, num_ranks: int, link: Link
) -> tuple[np.ndarray, np.ndarray]:
    """(all-gather, reduce-scatter) seconds per unit: parameters gathered in the compute dtype,
    gradients reduced in `grad_bytes_per_param`."""
    n = unit_params(model)
    gather = ring_gather_s(n * train.dtype_bytes, num_ranks, link)
    scatter = ring_gather_s(n * train.grad_bytes_per_param, num_ranks, link)
    return np.asarray(gather, dtype=float), np.asarray(scatter, dtype=float)


def overlapped_s(
    fwd_s: Sequence[float], bwd_s: Sequence[float], gather_s: np.ndarray, scatter_s: np.ndarray
) -> float:
    """One micro-batch's forward and backward with prefetch: each unit's compute overlaps the
    next unit's all-gather (in backward also the previous unit's reduce-scatter); the first
    all-gather of each pass and the last reduce-scatter are exposed."""
    num = len(fwd_s)
    ag = np.append(np.asarray(gather_s, dtype=float), 0.0)  # ag[num] = 0: nothing after the last
    forward = ag[0] + sum(max(fwd_s[u], ag[u + 1]) for u in range(num))
    order = list(range(num - 1, -1, -1))
    backward = ag[order[0]] + scatter_s[order[-1]]
    for k, u in enumerate(order):
        nxt = ag[order[k + 1]] if k + 1 < num else 0.0
        prev = scatter_s[order[k - 1]] if k > 0 else 0.0
        backward += max(bwd_s[u], nxt + prev)
    return float(forward + backward)


def sharded_bytes(model: ModelSpec, train: TrainSpec, num_ranks: int) -> float:
    """Persistent state per device: float32 parameters, gradients and optimizer state, 1/N."""
    master = 0 if train.precision != "fp32" else train.dtype_bytes  # fp32: weights are master
    per_param = master + train.kept_grad_bytes_per_param + train.optimizer_bytes_per_param
    return model.total_params * per_param / num_ranks


def fsdp_memory(
    model: ModelSpec, train: TrainSpec, costs: LayerCosts, num_ranks: int
) -> StageMemory:
    """Peak memory of one device (see the module docstring for what each term holds)."""
    n, biggest = model.total_params, float(unit_params(model).max())
    master = 0 if train.precision != "fp32" else train.dtype_bytes
    whole = stage_memory(model, train, costs, 0, len(model.layers), 1, 1)
    return StageMemory(
        weights=n * master / num_ranks + GATHERED_UNITS * biggest * train.dtype_bytes,
        grads=n * train.kept_grad_bytes_per_param / num_ranks
        + biggest * (train.dtype_bytes + train.grad_bytes_per_param),
        optimizer=n * train.optimizer_bytes_per_param / num_ranks,
        activations=whole.activations,
        recv_buffers=whole.recv_buffers,
        transient=whole.transient,
        reserve=whole.reserve,
    )


@dataclass(frozen=True)
class FsdpDevice:
    """One device of an FSDP plan."""

    device: int
    costs: LayerCosts
    """Its layer costs at its micro-batch size and recomputation."""
    own_s: float
    """Its forward and backward of every micro-batch at its own speed against the
    communication (what it would take if the others were as fast)."""
    memory: StageMemory
    optimizer_s: float
    """Its optimizer step on its shard."""


@dataclass(frozen=True)
class FsdpStep:
    devices: tuple[FsdpDevice, ...]
    lockstep_s: float
    """Forward and backward of every micro-batch, each unit at its slowest device."""
    compute_s: float
    """The same without communication (the slowest device per unit)."""
    iteration_time_s: float

    @property
    def exposed_comm_s(self) -> float:
        """Communication the prefetch does not hide."""
        return self.lockstep_s - self.compute_s


FsdpRank = tuple[int, int, bool]
"""One device of an FSDP plan: (device id, micro-batch size, whether it recomputes)."""


def fsdp_step(plan: Plan, cm: CostModel) -> FsdpStep:
    """Cost of one step of a fully sharded plan (`plan.sharding == "full"`)."""
    ranks = [
        (p.stages[0].device, p.micro_batch_size, p.stages[0].recomputes(cm.train))
        for p in plan.pipelines
    ]
    # One micro-batch count for every device (validate_plan).
    return fsdp_ranks_step(ranks, plan.pipelines[0].num_micro_batches, cm)


def fsdp_ranks_step(ranks: Sequence[FsdpRank], m: int, cm: CostModel) -> FsdpStep:
    """`fsdp_step` of the plan whose devices are `ranks`, in order, at `m` micro-batches (the
    FSDP search costs its candidates so, without building a plan of one pipeline per device)."""
    model, train, cluster = cm.model, cm.train, cm.cluster
    ids = [d for d, _, _ in ranks]
    gather, scatter = unit_comm_s(model, train, len(ids), group_link(cluster, ids))
    opt_s = {}
    own: dict[tuple[str, int, bool], tuple[LayerCosts, float, StageMemory]] = {}
    devices = []
    for device, size, recompute in ranks:  # devices of one type and size cost the same: once
        gpu = cluster.gpu(device)
        key = (gpu.name, size, recompute)
        if key not in own:
            costs = cm.layer_costs(gpu, size, recompute)
            own[key] = (
                costs,
                m * overlapped_s(costs.fwd_s, costs.bwd_s, gather, scatter),
                fsdp_memory(model, train, costs, len(ids)),
            )
        if gpu.name not in opt_s:
            opt_s[gpu.name] = optimizer_step_s(
                sharded_bytes(model, train, len(ids)), gpu.mem_bw_bytes_per_s
            )
        devices.append(FsdpDevice(device, *own[key], opt_s[gpu.name]))
    kinds = [v[0] for v in own.values()]
    fwd = np.max([c.fwd_s for c in kinds], axis=0)
    bwd = np.max([c.bwd_s for c in kinds], axis=0)
    lockstep = m * overlapped_s(fwd, bwd, gather, scatter)
    compute = m * float(fwd.sum() + bwd.sum())
    end = lockstep + max(d.optimizer_s for d in devices)
    return FsdpStep(tuple(devices), lockstep, compute, end)
