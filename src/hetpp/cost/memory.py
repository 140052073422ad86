"""Memory of one pipeline stage: model states, in-flight activations and a reserve."""

from __future__ import annotations

from typing import NamedTuple

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
        grads=n * train.grad_bytes_per_param,
        optimizer=n * train.optimizer_bytes_per_param,
        activations=acts,
        reserve=train.reserve_bytes,
    )
