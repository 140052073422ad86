"""Memory of one pipeline stage: model states, in-flight activations, torch's receive buffers,
transients and a reserve."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from importlib import resources
from typing import NamedTuple

import numpy as np

from hetpp.cost.action_graph import PARTS, order_columns
from hetpp.cost.compute import LayerCosts
from hetpp.cost.params import (
    rank_stored_params,
    replicated_params,
    stage_params,
    stepped_params,
    tied_copy_params,
)
from hetpp.specs.model import ModelSpec
from hetpp.specs.schedule import SCHEDULES, ScheduleSpec
from hetpp.specs.trainspec import TrainSpec


class StageMemory(NamedTuple):
    """Bytes a stage needs at its peak."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    """What the in-flight micro-batches hold until their backward: their layers' saved
    activations and the stage's output (torch's stage keeps it), less each one's input, which is
    a receive buffer (`recv_buffers`); under a split backward also, from a micro-batch's I to its
    W, the output gradients of its weighted ops that torch keeps for the W."""
    recv_buffers: float
    """torch's `PipelineStage` receive buffers at the stage's peak (`recv_buffer_counts`): one
    for the input activation of each micro-batch whose buffer is live (not on the first stage)
    and one for each live output gradient (not on the last)."""
    transient: float
    """What lasts one backward: a recomputed layer's full activations (under a split backward's
    W, every recomputed layer's, `_transient_bytes`), and the input gradients sent back (the one
    in transit and the next one, not on the first stage)."""
    reserve: float

    @property
    def total(self) -> float:
        return (
            self.weights
            + self.grads
            + self.optimizer
            + self.activations
            + self.recv_buffers
            + self.transient
            + self.reserve
        )


def model_state_bytes(model: ModelSpec, train: TrainSpec) -> float:
    """Weights, gradients and optimizer state of the whole model (tied weights once)."""
    return model.total_params * train.state_bytes_per_param


def optimizer_bytes(num_params: float, replicated: float, train: TrainSpec, shards: int) -> float:
    """Optimizer state of a stage's `num_params` parameters with `shards` owners sharing each
    bucket (`Plan.optimizer_shards`; 1: unsharded). Sharded: all of `optimizer_bytes_per_param`
    (mixed precision: the fp32 master weights and AdamW's m and v, 4 + 4 + 4; fp32: m and v)
    for 1/shards of the parameters; weights and the fp32 gradients stay whole (ZeRO-1). The
    `replicated` parameters (the tied matrix) keep their full state."""
    return stepped_params(num_params, replicated, shards) * train.optimizer_bytes_per_param


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


def recv_buffer_counts(
    schedule: ScheduleSpec | None,
    num_in_flight: int,
    num_micro_batches: int,
    stage: int | None = None,
    num_stages: int = 0,
    num_devices: int = 0,
) -> tuple[int, int]:
    """(activation, gradient) receive buffers stage `stage` of `num_stages` (on `num_devices`)
    holds at its peak. The runtime gives each of torch's buffers memory from its receive until
    the micro-batch's backward on the stage is done, its full backward or its W
    (`hetpp.runtime.recv_buffers`). Under a single-stage schedule (1F1B, GPipe) torch posts each
    receive just before the compute that reads it, so the live activations are the in-flight
    micro-batches and one gradient is live at a time. The multi-stage runtime runs torch's
    lowered IR, whose receives go in where the sender's compute is scheduled, ahead of their
    own (`_add_send_recv`); those counts are read from torch's IR, per stage at its peak of
    live buffers (`_lowered_counts`; not monotone in m below the m where they settle, so searches
    over m, `most_micro_batches`, pass no `stage`). Where the table has no entry (more than 8
    devices, other than `TABLE_CHUNKS` chunks, no `stage`), one buffer per micro-batch and
    direction, a bound."""
    if schedule is not None and not schedule.multi_stage:
        return num_in_flight, min(1, num_micro_batches)
    if schedule is not None and stage is not None and num_devices:
        last, rows = _lowered_counts(schedule.name, num_devices, num_stages // num_devices)
        # beyond the last m stored every m counts as that one (checked when the table is built)
        row = rows.get(min(num_micro_batches, last))
        if row is not None:
            return row[stage]
    return num_micro_batches, num_micro_batches


TABLE_CHUNKS = {"one": 1, "loop": 2, "v": 2}
"""Chunks per device of the pipelines whose receive buffers the table holds, per placement (the
chunk counts the planner's schedule pass tries)."""


@functools.cache
def _lowered_counts(name: str, num_devices: int, chunks: int) -> tuple[int, dict[int, tuple]]:
    """(last m, m -> per stage (activation, gradient) buffers live at its peak) in torch's
    lowered IR of schedule `name` at `chunks` chunks on `num_devices`, for every m torch runs up
    to the last m where a count changes (`hetpp/data/recv_buffers.json`, written from torch by
    `bench/recv_multi.py --write-table`, checked against torch by a test); (0, {}) if not in
    the table."""
    stored = chunks == TABLE_CHUNKS[SCHEDULES[name].placement]
    entry = _recv_table().get(name, {}).get(str(num_devices), {}) if stored else {}
    rows = {int(m): tuple(tuple(c) for c in row) for m, row in entry.items()}
    return max(rows, default=0), rows


@functools.cache
def _recv_table() -> dict:
    return json.loads(resources.files("hetpp.data").joinpath("recv_buffers.json").read_text())


def in_flight_counts(
    schedule: ScheduleSpec,
    num_micro_batches: int,
    num_devices: int,
    costs: Sequence[LayerCosts],
    layers: Sequence[tuple[int, int]],
) -> tuple[tuple[int, int], ...]:
    """Per stage of a pipeline (stage s holding `layers[s]` at `costs[s]`): (micro-batches whose
    activations it is charged, those of them between their I and their W), `stage_memory`'s
    `num_in_flight` and `num_pending`. One chunk, whole backwards: the stage's own peak
    (`ScheduleSpec.in_flight`), none pending. Otherwise (several stages per device, or a split
    backward): what each holds at the moment its device holds the most bytes, replaying the
    device's order (torch's, `ScheduleSpec.order`) with each stage's bytes per held and per
    pending micro-batch, so that summed over a device's stages (`device_memory`) they are the
    device's peak. Each stage's own peak summed would count stages that peak at different
    moments as if together (interleaved-zb on 4 devices: 12 micro-batches where the device never
    holds more than 8)."""
    num = len(layers)
    m = num_micro_batches
    if schedule.placement == "one" and not schedule.splits_backward:
        return tuple((schedule.in_flight(s, num, m), 0) for s in range(num))
    held = [_held_bytes(c, *span) for c, span in zip(costs, layers)]
    pending = [
        _pending_bytes(c, *span, _next_stage_local(schedule, (s, num, num_devices)))
        for s, (c, span) in enumerate(zip(costs, layers))
    ]
    counts = [(0, 0)] * num
    for states in _holding_states(schedule.name, num_devices, num // num_devices, m):
        peak = int(np.argmax(_state_loads(states, held, pending)))  # the first largest
        for j, s in enumerate(states.stages):
            counts[s] = (int(states.held[peak, j]), int(states.pending[peak, j]))
    return tuple(counts)


def _state_loads(
    states: HoldingStates, held: Sequence[float], pending: Sequence[float]
) -> np.ndarray:
    """Each state's bytes at `held[s]` per held and `pending[s]` per pending micro-batch of
    stage s, summed stage after stage from 0 as Python's `sum` over the stages would (the same
    floats)."""
    load = 0
    for j, s in enumerate(states.stages):
        load = load + (held[s] * states.held[:, j] + pending[s] * states.pending[:, j])
    return load


class HoldingStates(NamedTuple):
    """One device's candidate peaks in its order's replay (`_holding_states`)."""

    stages: tuple[int, ...]
    """The device's stages, ascending."""
    held: np.ndarray
    """Per state (row) and stage (column), the micro-batches it holds."""
    pending: np.ndarray
    """Per state and stage, those of them between their I and their W."""


@functools.lru_cache(maxsize=4096)
def _holding_states(name: str, num_devices: int, chunks: int, m: int) -> tuple[HoldingStates, ...]:
    """Per device: what its stages hold after each forward and each I of its order (the only
    steps that add), in ascending order of the (held but not pending, pending) counts stage
    after stage, those that another holds at least as many of on every stage left out (the
    states keep the held and the pending counts). A micro-batch is held from
    its forward to its backward, a split one's W (which needs them), as
    `ScheduleSpec.in_flight` counts; it is pending from its I to its W (torch keeps the weighted
    ops' output gradients for the W, `_pending_bytes`)."""
    device, kind, stage, _ = order_columns(name, num_devices, chunks, m)
    starts = np.searchsorted(device, np.arange(num_devices + 1))
    # each step's stage's place among its device's stages, ascending: its pair of columns
    key = device * (int(stage.max(initial=0)) + 1) + stage
    pairs = np.unique(key)
    local = np.searchsorted(pairs, key) - np.searchsorted(pairs, key - stage)
    width = 2 * (int(local.max(initial=0)) + 1)
    # the replay counts per stage the held micro-batches not pending and the pending ones: a
    # forward adds one of the first, an I moves it to the second, a B frees one of the first
    # and a W one of the second; the replay is their running sum, device by device. (Each
    # column's bytes are then never negative, as the pruning below needs: a pending one holds
    # `held + pending` bytes, where `pending` alone is negative on a last stage, whose I frees
    # the logits.)
    delta = np.zeros((len(kind), width), dtype=int)
    row = np.arange(len(kind))
    delta[row, 2 * local] = (kind == PARTS["F"]) * 1 - (kind == PARTS["I"]) - (kind == PARTS["B"])
    delta[row, 2 * local + 1] = (kind == PARTS["I"]) * 1 - (kind == PARTS["W"])
    held = np.cumsum(delta, axis=0)
    held -= np.concatenate([np.zeros((1, width), dtype=int), held])[starts[device]]
    adds = (kind == PARTS["F"]) | (kind == PARTS["I"])  # the only steps that add
    # the states of all devices sorted at once as (device, counts) tuples sort, then distinct
    states = np.column_stack([device[adds], held[adds]])
    states = states[np.lexsort(states.T[::-1])]
    states = states[np.r_[True, (states[1:] != states[:-1]).any(axis=1)]]
    cut = np.searchsorted(states[:, 0], np.arange(num_devices + 1))
    out = []
    for d in range(num_devices):
        stages = sorted(set(stage[starts[d] : starts[d + 1]].tolist()))
        counts = states[cut[d] : cut[d + 1], 1 : 1 + 2 * len(stages)]
        # a state another one holds at least as much of everywhere never is the peak (the
        # states are distinct, so "at least" on every column is "more" somewhere)
        covers = np.ones((len(counts), len(counts)), dtype=bool)
        for column in counts.T:  # a column at a time: no states x states x columns array
            covers &= column[None, :] >= column[:, None]
        np.fill_diagonal(covers, False)
        kept = counts[~covers.any(axis=1)]
        pending = kept[:, 1::2]
        out.append(HoldingStates(tuple(stages), kept[:, 0::2] + pending, pending))
    return tuple(out)


def _held_bytes(costs: LayerCosts, start: int, end: int) -> float:
    """What one in-flight micro-batch holds on the stage of layers [start, end): its layers'
    saved activations and its output, less its input (a receive buffer)."""
    inp, out = _boundary_at(costs, start, end)
    return costs.saved(start, end) + out - inp


def _pending_bytes(costs: LayerCosts, start: int, end: int, local_next: bool = False) -> float:
    """What one micro-batch between its I and its W holds on the stage of layers [start, end)
    besides `_held_bytes`: torch's `stage_backward_input` keeps the gradient flowing into each
    op that reads a weight until `stage_backward_weight` (`LayerSpec`'s
    `weight_grad_input_bytes_per_sample`), less the stage's output gradient: the gradient
    flowing into its last block's down projection is that tensor (a view), a receive buffer
    until the W (`recv_buffers`), except where the next stage runs on the same device
    (`local_next`, a V's turn): torch hands that stage's input gradient over in place of the
    buffer (`set_local_bwd_input`), a tensor no buffer counts, so it is charged here; and less,
    on a pipeline's last stage, the head's logits and the loss's log-probabilities, which
    torch's I frees (`LayerCosts.input_grad_freed`; measured: `hetpp train --memory-report`,
    docs/benchmarks-runtime.md). None on a pipeline's first stage, where torch skips the I and
    its W runs the whole backward."""
    if start == 0:
        return 0.0
    received = 0.0 if local_next else _boundary_at(costs, start, end)[1]
    freed = costs.input_grad_freed(start, end)
    return costs.weight_grad_inputs(start, end) - received - freed


def _next_stage_local(schedule: ScheduleSpec | None, place: tuple[int, int, int] | None) -> bool:
    """Whether stage `place[0]` of `place[1]` sends to a stage on its own device (`place[2]`
    devices under `schedule`'s placement)."""
    if schedule is None or place is None or place[0] + 1 >= place[1]:
        return False
    stage, _, num_devices = place
    return schedule.device_index(stage, num_devices) == schedule.device_index(
        stage + 1, num_devices
    )


def stage_memory(
    model: ModelSpec,
    train: TrainSpec,
    costs: LayerCosts,
    start: int,
    end: int,
    num_in_flight: int,
    num_micro_batches: int,
    shards: int = 1,
    schedule: ScheduleSpec | None = None,
    place: tuple[int, int, int] | None = None,
    num_pending: int = 0,
) -> StageMemory:
    """Memory of the stage holding layers [start, end) that runs `num_micro_batches` per step
    under `schedule`, `num_in_flight` of them at once (the schedule's `in_flight`), its optimizer
    state sharded `shards` ways (`optimizer_bytes`); `place`, (stage, stages, devices) of its
    pipeline, gives a multi-stage schedule's receive buffers their live count (without it: the
    bound); `num_pending` of the in-flight ones are between their I and their W, each holding
    `_pending_bytes` more (`in_flight_counts`). The input a stage's first layer saves for
    backward is its activation receive buffer: `activations` leaves it out, `recv_buffers`
    counts it (one per live buffer, `recv_buffer_counts`)."""
    n = stage_params(model, start, end, costs.tp)
    shared = _tied_on_first_device(model, start, end, schedule, place)
    copied = n - _uncopied_params(model, train, start, end)
    if train.precision == "fp32" or train.half_params:  # the weights are the parameters
        copied -= shared
    inp, out = _boundary_at(costs, start, end)
    acts, grads = recv_buffer_counts(schedule, num_in_flight, num_micro_batches, *(place or ()))
    replicated = replicated_params(model, start, end) - shared
    return StageMemory(
        weights=copied * train.dtype_bytes,
        grads=(n - shared) * train.kept_grad_bytes_per_param,
        optimizer=optimizer_bytes(n - shared, replicated, train, shards),
        activations=num_in_flight * _held_bytes(costs, start, end)
        + num_pending * _pending_bytes(costs, start, end, _next_stage_local(schedule, place)),
        recv_buffers=acts * inp + grads * out,
        transient=_transient_bytes(costs, start, end, schedule) + 2 * inp,
        reserve=train.reserve_bytes,
    )


def _tied_on_first_device(
    model: ModelSpec,
    start: int,
    end: int,
    schedule: ScheduleSpec | None,
    place: tuple[int, int, int] | None,
) -> int:
    """The head's copy of a tied embedding matrix on a last stage [start, end) whose device
    also runs the pipeline's first stage (a V's first device): the runtime ties the two to one
    Parameter on the rank (`RankModel`), so its gradient and optimizer state are the first
    stage's, and so is the weight itself where the weights term is the parameter (measured:
    `hetpp train --memory-report`, docs/benchmarks-runtime.md); 0 otherwise."""
    if schedule is None or place is None or start == 0 or end < len(model.layers):
        return 0
    stage, _, num_devices = place
    if schedule.device_index(stage, num_devices) != schedule.device_index(0, num_devices):
        return 0
    return tied_copy_params(model)


def _transient_bytes(
    costs: LayerCosts, start: int, end: int, schedule: ScheduleSpec | None
) -> float:
    """What a backward of the stage of layers [start, end) re-grows of its recomputed layers'
    activations: one layer's at a time in a whole backward or an I, but a split backward's W,
    run in one `GraphExecGroup`, recomputes every block and keeps what it recomputed to its end
    (measured: tests/unit/test_recompute_split_backward.py), so there every recomputed layer's
    activations beyond the input its checkpoint kept. Not on a pipeline's first stage, whose W
    is one whole backward (`cost.pipeline.RECOMPUTES_IN_WEIGHT_GRAD`)."""
    extra = costs.peak_extra_bytes[start:end]
    one = float(extra.max(initial=0.0))
    if schedule is None or not schedule.splits_backward or start == 0:
        return one
    kept = costs.saved_bytes[start:end]
    return max(one, float((extra - np.where(extra > 0, kept, 0.0)).sum()))


class MemoryParts(NamedTuple):
    """`stage_memory` of every layer range, as (L+1) x (L+1) arrays indexed `[start, end]`:
    `total = fixed + in_flight * per_in_flight + activation_buffers * per_activation_buffer +
    gradient_buffers * per_gradient_buffer` for `start < end` (entries with `start >= end` are
    meaningless; the buffer counts from `recv_buffer_counts`)."""

    fixed: np.ndarray
    """Model states, transients and the reserve."""
    per_in_flight: np.ndarray
    """What each in-flight micro-batch holds (`StageMemory.activations` of one)."""
    per_activation_buffer: np.ndarray
    """One activation receive buffer (the stage's input; a broadcast view)."""
    per_gradient_buffer: np.ndarray
    """One gradient receive buffer (the stage's output; a broadcast view)."""


def stage_memory_parts(model: ModelSpec, train: TrainSpec, costs: LayerCosts) -> MemoryParts:
    """`stage_memory` for every layer range at once, for planners that try many splits."""
    num = len(model.layers)
    stored = rank_stored_params(model, costs.tp)
    params = np.concatenate([[0], np.cumsum(stored)])
    n = params[None, :] - params[:, None]
    n[0, num] -= tied_copy_params(model)  # one tensor serves tied embedding and head
    inp, out = _boundary_bytes(costs)
    transient = _range_max(costs.peak_extra_bytes) + 2 * inp[:, None]
    saved = costs.saved_cum[None, :] - costs.saved_cum[:, None]
    state = n * train.state_bytes_per_param
    state[0, 1:] -= [
        _uncopied_params(model, train, 0, b) * train.dtype_bytes for b in range(1, num + 1)
    ]
    shape = (num + 1, num + 1)
    return MemoryParts(
        fixed=state + transient + train.reserve_bytes,
        per_in_flight=saved + out[None, :] - inp[:, None],
        per_activation_buffer=np.broadcast_to(inp[:, None], shape),
        per_gradient_buffer=np.broadcast_to(out[None, :], shape),
    )


def most_micro_batches(memory: Callable[[int], float], capacity: float, limit: int) -> int:
    """Most micro-batches per step, at most `limit`, for which a stage's `memory(m)` (bytes;
    non-decreasing in m: in-flight activations and live receive buffers never shrink) fits
    `capacity`; 0 if not even one does. Checks `limit` first: most stages are not bound."""
    if memory(limit) <= capacity:
        return limit
    lo, hi = 0, limit  # memory(lo) fits (or lo = 0), memory(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if memory(mid) <= capacity:
            lo = mid
        else:
            hi = mid
    return lo


def _uncopied_params(model: ModelSpec, train: TrainSpec, start: int, end: int) -> int:
    """Stored parameters of [start, end) without a `weights` term. In mixed precision that term
    is autocast's half-precision copy of each weight an autocast op reads (a matmul, including a
    tied head's); an embedding lookup is not one, so the first stage's tables have no copy,
    except the token table when the tied head on the same stage reads it. (Norm weights are not
    copied either, but are too few to count: 2-4 h of a block's ~12 h^2.) In fp32, and with
    half-precision parameters (`TrainSpec.master_weights` "optimizer"), the term is the
    parameters themselves."""
    if train.precision == "fp32" or train.half_params or start > 0:
        return 0
    tables = model.layers[0].stored_params
    return tables - (tied_copy_params(model) if end == len(model.layers) else 0)


def _boundary_bytes(costs: LayerCosts) -> tuple[np.ndarray, np.ndarray]:
    """`(inp, out)`, each of length L+1: `inp[a]`, the bytes a stage starting at layer a
    receives per micro-batch (0 for a = 0), and `out[b]`, the bytes a stage ending before layer
    b sends (0 for b = L). A gradient has its activation's size."""
    send = costs.send_bytes
    inp = np.concatenate([[0.0], send])
    out = np.concatenate([[0.0], send[:-1], [0.0]])
    return inp, out


def _boundary_at(costs: LayerCosts, start: int, end: int) -> tuple[float, float]:
    """`_boundary_bytes(costs)` read at `inp[start]` and `out[end]`, without building the
    arrays (the full cost asks for one stage at a time)."""
    send, num = costs.send_bytes, len(costs.send_bytes)
    inp = float(send[start - 1]) if start > 0 else 0.0
    out = float(send[end - 1]) if 0 < end < num else 0.0
    return inp, out


def _range_max(values: np.ndarray) -> np.ndarray:
    """`out[a, b] = max(values[a:b], initial=0)` for all a < b, as an (L+1) x (L+1) array."""
    num = len(values)
    out = np.zeros((num + 1, num + 1))
    for a in range(num):
        out[a, a + 1 :] = np.maximum.accumulate(np.maximum(values[a:], 0.0))
    return out


def device_memory(stages: Sequence[StageMemory]) -> StageMemory:
    """One device's memory when it runs several stages (interleaved and V schedules): their
    states, activations and receive buffers add up (each stage's activations at the device's
    peak, as `in_flight_counts` counts them; every stage keeps its own buffers), and so
    do the stages' transients (a bound: one backward runs at a time, but the replay shows a
    stage's transient can meet another stage's peak of held activations), the reserve counts
    once."""
    return StageMemory(
        weights=sum(s.weights for s in stages),
        grads=sum(s.grads for s in stages),
        optimizer=sum(s.optimizer for s in stages),
        activations=sum(s.activations for s in stages),
        recv_buffers=sum(s.recv_buffers for s in stages),
        transient=sum(s.transient for s in stages),
        reserve=stages[0].reserve,
    )
