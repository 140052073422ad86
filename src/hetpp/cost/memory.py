"""Memory of one pipeline stage: model states, in-flight activations and a reserve."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hetpp.cost.compute import LayerCosts
from hetpp.specs.model import ModelSpec
from hetpp.specs.train import TrainSpec


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


def kept_grad_bytes(train: TrainSpec) -> int:
    """Bytes per gradient element a stage keeps: the runtime accumulates gradients in the fp32
    master weights' dtype, so at least 4 whatever the reduction dtype (`grad_bytes_per_param`,
    the bytes each all-reduce sends) is."""
    return max(train.grad_bytes_per_param, 4)


def in_flight(schedule: str, stage: int, num_stages: int, num_micro_batches: int) -> int:
    """Micro-batches whose activations a stage holds at once: 1F1B warms up S - s of them."""
    if schedule == "gpipe":
        return num_micro_batches
    return min(num_micro_batches, num_stages - stage)


def stage_params(model: ModelSpec, start: int, end: int) -> int:
    """Parameters stored by a stage holding layers [start, end).

    A tied head stores its own copy of the embedding matrix unless the embedding is in the same
    stage, where one tensor serves both."""
    layers = model.layers[start:end]
    total = sum(x.stored_params for x in layers)
    last = model.layers[-1]
    if start == 0 and end == len(model.layers) and last.stored_params != last.params:
        total -= last.stored_params - last.params
    return total


def stage_memory(
    model: ModelSpec, train: TrainSpec, costs: LayerCosts, start: int, end: int, num_in_flight: int
) -> StageMemory:
    n = stage_params(model, start, end)
    acts = num_in_flight * costs.saved(start, end)
    acts += float(costs.peak_extra_bytes[start:end].max(initial=0.0))
    acts += 2 * float(costs.send_bytes[start:end].max(initial=0.0))  # recv + send buffers
    return StageMemory(
        weights=n * train.dtype_bytes,
        grads=n * kept_grad_bytes(train),
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
    params = np.concatenate([[0], np.cumsum([x.stored_params for x in model.layers])])
    n = params[None, :] - params[:, None]
    last = model.layers[-1]
    if last.stored_params != last.params:
        n[0, num] -= last.stored_params - last.params  # one tensor serves tied embedding and head
    state = n * (train.dtype_bytes + kept_grad_bytes(train) + train.optimizer_bytes_per_param)
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
