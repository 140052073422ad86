"""Stage balance: split the layer list over an ordered list of devices.

Everything works on (L+1) x (L+1) tables indexed `[start, end]` built once per (GPU type,
micro-batch size): the per-micro-batch forward+backward time of layers `[start, end)` and the
memory terms of `hetpp.cost.memory.stage_memory_parts`. A split is then a dynamic program over
those arrays (numpy), with no Python loop over layers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hetpp.cost.compute import CostModel, LayerCosts
from hetpp.cost.memory import most_micro_batches, recv_buffer_counts, stage_memory_parts
from hetpp.specs.schedule import ScheduleSpec

# Planner-side slack on memory so that float rounding never makes a split the planner accepts
# fail the cost model's own check (1 MB, far below any real headroom).
MEMORY_SLACK_BYTES = 1e6

Load = tuple[int, int, int]
"""What a stage holds at its peak: (micro-batches in flight, live activation receive buffers,
live gradient receive buffers), `stage_load`."""


@dataclass(frozen=True)
class StageTables:
    """Per-range costs of the model's layers on one GPU type at one micro-batch size."""

    costs: LayerCosts
    time: np.ndarray
    """`time[a, b]`: forward + backward seconds of layers [a, b) for one micro-batch."""
    mem_fixed: np.ndarray
    """Bytes a stage holding [a, b) needs regardless of in-flight micro-batches."""
    mem_per_in_flight: np.ndarray
    """Bytes each in-flight micro-batch adds."""
    mem_per_activation_buffer: np.ndarray
    """Bytes of one live activation receive buffer."""
    mem_per_gradient_buffer: np.ndarray
    """Bytes of one live gradient receive buffer."""
    capacity: float
    """Usable device memory, bytes (with the planner slack taken off)."""
    _masked: dict[Load, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def layer_list_len(self) -> int:
        return len(self.time) - 1

    def memory(self, start: int, end: int, load: Load) -> float:
        """Bytes a stage holding [start, end) needs under `load`."""
        in_flight, acts, grads = load
        return float(
            self.mem_fixed[start, end]
            + in_flight * self.mem_per_in_flight[start, end]
            + acts * self.mem_per_activation_buffer[start, end]
            + grads * self.mem_per_gradient_buffer[start, end]
        )

    def fits(self, load: Load) -> np.ndarray:
        """Boolean `[a, b]` mask: layers [a, b) fit under `load` (a < b only)."""
        in_flight, acts, grads = load
        mem = self.mem_fixed + in_flight * self.mem_per_in_flight
        mem = mem + acts * self.mem_per_activation_buffer + grads * self.mem_per_gradient_buffer
        ok = mem <= self.capacity
        return ok & _upper(len(ok))

    def masked_time(self, load: Load) -> np.ndarray:
        """`time` where the range fits under `load`, else inf (cached)."""
        if load not in self._masked:
            self._masked[load] = np.where(self.fits(load), self.time, np.inf)
        return self._masked[load]


@functools.lru_cache(maxsize=64)
def _upper(n: int) -> np.ndarray:
    """The n x n mask of a < b (`np.triu(ones, 1)`, built once per size)."""
    mask = np.triu(np.ones((n, n), dtype=bool), 1)
    mask.flags.writeable = False  # shared by every caller
    return mask


def stage_tables(cm: CostModel, costs: LayerCosts) -> StageTables:
    """Build the range tables of one (GPU type, micro-batch size) from its layer costs."""
    total = costs.fwd_cum + costs.bwd_cum
    parts = stage_memory_parts(cm.model, cm.train, costs)
    return StageTables(
        costs=costs,
        time=total[None, :] - total[:, None],
        mem_fixed=parts.fixed,
        mem_per_in_flight=parts.per_in_flight,
        mem_per_activation_buffer=parts.per_activation_buffer,
        mem_per_gradient_buffer=parts.per_gradient_buffer,
        capacity=costs.gpu.memory_bytes - MEMORY_SLACK_BYTES,
    )


def in_flight_per_stage(schedule: ScheduleSpec, num_stages: int) -> list[Load]:
    """Each stage's load at the fewest micro-batches the schedule allows: splits are made for
    those (more micro-batches only add memory: receive buffers, and for GPipe activations), and
    the micro-batch cap (`max_micro_batches`) bounds m afterwards."""
    m = schedule.min_micro_batches(num_stages)
    return [stage_load(schedule, s, num_stages, m) for s in range(num_stages)]


def stage_load(schedule: ScheduleSpec, stage: int, num_stages: int, m: int) -> Load:
    """Stage `stage`'s `Load` at `m` micro-batches per step."""
    k = schedule.in_flight(stage, num_stages, m)
    return (k, *recv_buffer_counts(schedule, k, m))


def max_micro_batches(
    tables: Sequence[StageTables], bounds: Sequence[int], schedule: ScheduleSpec, limit: int
) -> int:
    """Most micro-batches per step (at most `limit`) with which every stage of this split fits
    (0: not even one); the rule of every schedule, from its registry entry's `in_flight`."""
    num = len(tables)

    def stage_cap(s: int, t: StageTables, a: int, b: int) -> int:
        # The range's memory terms read once: the same float operations as
        # `StageTables.memory`, so the same bytes.
        fixed, per_in_flight = float(t.mem_fixed[a, b]), float(t.mem_per_in_flight[a, b])
        per_act = float(t.mem_per_activation_buffer[a, b])
        per_grad = float(t.mem_per_gradient_buffer[a, b])

        def mem(m: int) -> float:
            k, acts, grads = stage_load(schedule, s, num, m)
            return fixed + k * per_in_flight + acts * per_act + grads * per_grad

        return most_micro_batches(mem, t.capacity, limit)

    spans = zip(tables, bounds, bounds[1:])
    return min(stage_cap(s, t, a, b) for s, (t, a, b) in enumerate(spans))


def balance_stages(
    tables: Sequence[StageTables], loads: Sequence[Load], forced: Sequence[int] = ()
) -> tuple[int, ...] | None:
    """Contiguous split of all layers over `len(tables)` stages (stage s on `tables[s]`'s type)
    minimizing the slowest stage, then the sum of stage times, with every stage's memory within
    its device, and a cut at every layer index in `forced`. Returns the S+1 cut points
    `(0, ..., L)`, or None if no split fits.

    Two dynamic programs over ranges: the first finds the least bottleneck `tau`, the second
    the least total time among splits whose stages all stay within `tau`. O(S L^2), vectorized."""
    return balance_times([t.masked_time(load) for t, load in zip(tables, loads)], forced)


def balance_times(
    times: Sequence[np.ndarray], forced: Sequence[int] = ()
) -> tuple[int, ...] | None:
    """`balance_stages` on each stage's `[a, b]` time table (inf where the range does not fit)."""
    num = len(times[0]) - 1
    if len(times) > num:
        return None
    if forced:
        # No stage may straddle a forced cut: [a, b) is out if some cut f has a < f < b.
        mark = np.zeros(num + 1)
        mark[list(forced)] = 1
        before = np.cumsum(mark)  # forced cuts at or below each index
        inside = before[None, :] - mark[None, :] - before[:, None] > 0
        times = [np.where(inside, np.inf, t) for t in times]
    # Every stage holds a layer at least, so stage s starts at a cut in [s, s + slack] and
    # ends at one in [s + 1, s + 1 + slack]: each DP step reads that window of its table only
    # (the splits outside it are none; the same sums and comparisons, so the same split).
    slack = num - len(times)
    windows = [t[s : s + slack + 1, s + 1 : s + slack + 2] for s, t in enumerate(times)]
    best = np.full(slack + 1, np.inf)
    best[0] = 0.0
    for w in windows:
        best = np.maximum(best[:, None], w).min(axis=0)
    tau = best[slack]
    if not np.isfinite(tau):
        return None
    limit = tau * (1 + 1e-12)
    total = np.full(slack + 1, np.inf)
    total[0] = 0.0
    choice, ends = [], np.arange(slack + 1)
    for w in windows:
        cand = total[:, None] + np.where(w <= limit, w, np.inf)
        arg = cand.argmin(axis=0)
        total = cand[arg, ends]
        choice.append(arg)
    cuts = [num]
    for s in reversed(range(len(times))):  # window places back to cut points
        cuts.append(int(choice[s][cuts[-1] - s - 1]) + s)
    return tuple(reversed(cuts))


def equal_bounds(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers dealt out as evenly as possible (the first stages get the extra ones)."""
    base, extra = divmod(num_layers, num_stages)
    cuts = [0]
    for s in range(num_stages):
        cuts.append(cuts[-1] + base + (1 if s < extra else 0))
    return tuple(cuts)


def bounds_fit(tables: Sequence[StageTables], loads: Sequence[Load], bounds: Sequence[int]) -> bool:
    """Whether a given split fits every stage's memory."""
    return all(
        t.memory(a, b, load) <= t.capacity
        for t, load, a, b in zip(tables, loads, bounds, bounds[1:])
    )
