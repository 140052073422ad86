"""Memory of one pipeline stage: model states, in-flight activations and a reserve."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from hetpp.cost.compute import LayerCosts
from hetpp.cost.params import block_param_share, stage_params, tied_copy_params
from hetpp.specs.model import ModelSpec
from hetpp.specs.trainspec import TrainSpec


class StageMemory(NamedTuple):
    """Bytes a stage needs at its peak."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    """In-flight micro-batches' saved activations, the transient peak of one backward when
    recomputing, and the send/receive buffers."""
    reserve: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.reserve


def model_state_bytes(model: ModelSpec, train: TrainSpec) -> float:
    """Weights, gradients and optimizer state of the whole model (tied weights once)."""
    return model.total_params * train.state_bytes_per_param


def usable_bytes(capacity_bytes: float, train: TrainSpec) -> float:
    """What a device of `capacity_bytes` offers after the reserve."""
    return capacity_bytes - train.reserve_bytes


def devices_to_hold(nbytes: float, capacity_bytes: float, train: TrainSpec) -> int | None:
    """Fewest devices of `capacity_bytes` each that hold `nbytes` of model state (activations
    would only add); None if the reserve leaves such a device nothing."""
    usable = usable_bytes(capacity_bytes, train)
    if usable <= 0:
        return None
    return max(1, math.ceil(nbytes / usable))


def stage_memory(
    model: ModelSpec, train: TrainSpec, costs: LayerCosts, start: int, end: int, num_in_flight: int
) -> StageMemory:
    n = stage_params(model, start, end, costs.tp)
    acts = num_in_flight * costs.saved(start, end)
    acts += float(costs.peak_extra_bytes[start:end].max(initial=0.0))
    acts += 2 * float(costs.send_bytes[start:end].max(initial=0.0))  # recv + send buffers
    return StageMemory(
        weights=n * train.dtype_bytes,
        grads=n * train.kept_grad_bytes_per_param,
        optimizer=n * train.optimizer_bytes_per_param,
        activations=acts,
        reserve=train.reserve_bytes,
    )


def stage_memory_parts(
    model: ModelSpec, train: TrainSpec, costs: LayerCosts
) -> tuple[np.ndarray, np.ndarray]:
    """`stage_memory` for every layer range at once, for planners that try many splits.

    Returns `(fixed, per_micro_batch)`, two (L+1) x (L+1) arrays indexed `[start, end]`, such that
    `stage_memory(model, train, costs, start, end, k).total == fixed[start, end] + k *
    per_micro_batch[start, end]` for `start < end` (entries with `start >= end` are meaningless).
    Same terms as `stage_memory`: model states, the largest transient backward peak, two
    send/receive buffers and the reserve are fixed; in-flight saved activations scale with k."""
    num = len(model.layers)
    stored = np.array([x.stored_params for x in model.layers]) * block_param_share(model, costs.tp)
    params = np.concatenate([[0], np.cumsum(stored)])
    n = params[None, :] - params[:, None]
    n[0, num] -= tied_copy_params(model)  # one tensor serves tied embedding and head
    state = n * train.state_bytes_per_param
    fixed = state + _range_max(costs.peak_extra_bytes) + 2 * _range_max(costs.send_bytes)
    saved = costs.saved_cum[None, :] - costs.saved_cum[:, None]
    return fixed + train.reserve_bytes, saved


def _range_max(values: np.ndarray) -> np.ndarray:
    """`out[a, b] = max(values[a:b], initial=0)` for all a < b, as an (L+1) x (L+1) array."""
    num = len(values)
    out = np.zeros((num + 1, num + 1))
    for a in range(num):
        out[a, a + 1 :] = np.maximum.accumulate(np.maximum(values[a:], 0.0))
    return out
