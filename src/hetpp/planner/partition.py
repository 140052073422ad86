"""Stage balance: split the layer list over an ordered list of devices.

Everything works on (L+1) x (L+1) tables indexed `[start, end]` built once per (GPU type,
micro-batch size): the per-micro-batch forward+backward time of layers `[start, end)` and the
memory terms of `hetpp.cost.memory.stage_memory_parts`. A split is then a dynamic program over
those arrays (numpy), with no Python loop over layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hetpp.cost.compute import CostModel, LayerCosts
from hetpp.cost.memory import stage_memory_parts
from hetpp.specs.schedule import ScheduleSpec

# Planner-side slack on memory so that float rounding never makes a split the planner accepts
# fail the cost model's own check (1 MB, far below any real headroom).
MEMORY_SLACK_BYTES = 1e6


@dataclass(frozen=True)
class StageTables:
    """Per-range costs of the model's layers on one GPU type at one micro-batch size."""

    costs: LayerCosts
    time: np.ndarray
    """`time[a, b]`: forward + backward seconds of layers [a, b) for one micro-batch."""
    mem_fixed: np.ndarray
    """Bytes a stage holding [a, b) needs regardless of in-flight micro-batches."""
    mem_per_micro_batch: np.ndarray
    """Bytes each in-flight micro-batch adds."""
    capacity: float
    """Usable device memory, bytes (with the planner slack taken off)."""
    _masked: dict[int, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def layer_list_len(self) -> int:
        return len(self.time) - 1

    def fits(self, in_flight: int) -> np.ndarray:
        """Boolean `[a, b]` mask: layers [a, b) fit with `in_flight` micro-batches (a < b only)."""
        ok = self.mem_fixed + in_flight * self.mem_per_micro_batch <= self.capacity
        return np.triu(ok, 1)

    def masked_time(self, in_flight: int) -> np.ndarray:
        """`time` where the range fits with `in_flight` micro-batches, else inf (cached)."""
        if in_flight not in self._masked:
            self._masked[in_flight] = np.where(self.fits(in_flight), self.time, np.inf)
        return self._masked[in_flight]

    def max_in_flight(self, start: int, end: int) -> int:
        """Most micro-batches a stage holding [start, end) can keep in flight (0: not even one)."""
        free = self.capacity - self.mem_fixed[start, end]
        per = self.mem_per_micro_batch[start, end]
        if free < per:
            return 0
        return int(free // per) if per > 0 else 1 << 30


def stage_tables(cm: CostModel, costs: LayerCosts) -> StageTables:
    """Build the range tables of one (GPU type, micro-batch size) from its layer costs."""
    total = costs.fwd_cum + costs.bwd_cum
    fixed, per_mb = stage_memory_parts(cm.model, cm.train, costs)
    return StageTables(
        costs=costs,
        time=total[None, :] - total[:, None],
        mem_fixed=fixed,
        mem_per_micro_batch=per_mb,
        capacity=costs.gpu.memory_bytes - MEMORY_SLACK_BYTES,
    )


def in_flight_per_stage(schedule: ScheduleSpec, num_stages: int) -> list[int]:
    """Micro-batches each stage holds at the fewest micro-batches the schedule allows: splits
    are made for those (1F1B: S - s, whatever m; GPipe: one, and memory caps m afterwards)."""
    m = schedule.min_micro_batches(num_stages)
    return [schedule.in_flight(s, num_stages, m) for s in range(num_stages)]


def balance_stages(
    tables: Sequence[StageTables], in_flight: Sequence[int], forced: Sequence[int] = ()
) -> tuple[int, ...] | None:
    """Contiguous split of all layers over `len(tables)` stages (stage s on `tables[s]`'s type)
    minimizing the slowest stage, then the sum of stage times, with every stage's memory within
    its device, and a cut at every layer index in `forced`. Returns the S+1 cut points
    `(0, ..., L)`, or None if no split fits.

    Two dynamic programs over ranges: the first finds the least bottleneck `tau`, the second
    the least total time among splits whose stages all stay within `tau`. O(S L^2), vectorized."""
    num = tables[0].layer_list_len
    stages = len(tables)
    if stages > num:
        return None
    times = [t.masked_time(k) for t, k in zip(tables, in_flight)]
    if forced:
        # No stage may straddle a forced cut: [a, b) is out if some cut f has a < f < b.
        mark = np.zeros(num + 1)
        mark[list(forced)] = 1
        before = np.cumsum(mark)  # forced cuts at or below each index
        inside = before[None, :] - mark[None, :] - before[:, None] > 0
        times = [np.where(inside, np.inf, t) for t in times]
    best = np.full(num + 1, np.inf)
    best[0] = 0.0
    for t in times:
        best = np.maximum(best[:, None], t).min(axis=0)
    tau = best[num]
    if not np.isfinite(tau):
        return None
    limit = tau * (1 + 1e-12)
    total = np.full(num + 1, np.inf)
    total[0] = 0.0
    choice = []
    for t in times:
        cand = total[:, None] + np.where(t <= limit, t, np.inf)
        arg = cand.argmin(axis=0)
        total = cand[arg, np.arange(num + 1)]
        choice.append(arg)
    cuts = [num]
    for arg in reversed(choice):
        cuts.append(int(arg[cuts[-1]]))
    return tuple(reversed(cuts))


def equal_bounds(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers dealt out as evenly as possible (the first stages get the extra ones)."""
    base, extra = divmod(num_layers, num_stages)
    cuts = [0]
    for s in range(num_stages):
        cuts.append(cuts[-1] + base + (1 if s < extra else 0))
    return tuple(cuts)


def bounds_fit(
    tables: Sequence[StageTables], in_flight: Sequence[int], bounds: Sequence[int]
) -> bool:
    """Whether a given split fits every stage's memory."""
    return all(
        t.mem_fixed[a, b] + k * t.mem_per_micro_batch[a, b] <= t.capacity
        for t, k, a, b in zip(tables, in_flight, bounds, bounds[1:])
    )
