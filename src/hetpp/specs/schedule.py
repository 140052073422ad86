"""Pipeline schedules as data: one registry entry per schedule, read by every layer.

The planner asks an entry how many micro-batches a pipeline needs and how many each stage keeps
in flight; the cost model looks up the entry's timing rule (`hetpp.cost.pipeline.TIMING_RULES`);
the simulator expands its per-stage order into actions; the runtime builds its torch class.
Adding a schedule is one entry here plus its timing rule there, if it needs a new one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

StepKind = Literal["F", "B", "I", "W"]
"""Forward; full backward; backward for the input only (sends the gradient upstream); backward for
the weights only (local: what completes a parameter's gradient when the backward is split)."""
Step = tuple[StepKind, int, int]
"""One compute step of a rank: (kind, stage, micro-batch), torch's `_Action` without comms."""

Placement = Literal["one", "loop", "v"]
"""How a schedule places a pipeline's stages on its devices: "one" stage per device; "loop":
stage i on device i mod D (interleaved schedules, several chunks per device); "v": two chunks per
device, stage i on device i going down and on device 2D - 1 - i coming back (ZBV, DualPipeV)."""


def gpipe_order(rank: int, num_ranks: int, chunks: int, num_micro_batches: int) -> list[Step]:
    """ScheduleGPipe: all forwards, then all backwards in micro-batch order."""
    m = num_micro_batches
    return [("F", rank, k) for k in range(m)] + [("B", rank, k) for k in range(m)]


def one_f_one_b_order(rank: int, num_ranks: int, chunks: int, num_micro_batches: int) -> list[Step]:
    """Schedule1F1B: `S - s - 1` warm-up forwards, then 1F/1B pairs, then the cool-down
    backwards (torch runs `S - s` warm-up forwards and then 1B1F pairs: the same order).

    Stage s therefore holds at most `min(m, S - s)` micro-batches' activations at once."""
    m, s = num_micro_batches, rank
    warmup = min(m, num_ranks - s - 1)
    out: list[Step] = [("F", s, k) for k in range(warmup)]
    for i in range(m - warmup):
        out += [("F", s, warmup + i), ("B", s, i)]
    return out + [("B", s, i) for i in range(m - warmup, m)]


def _rounds(num_ranks: int, num_micro_batches: int) -> tuple[int, int]:
    """Interleaved schedules' (rounds, micro-batches per round): torch's "flex" rule."""
    rounds = max(1, num_micro_batches // num_ranks)
    return rounds, num_micro_batches // rounds


def _interleaved_order(
    rank: int, num_ranks: int, chunks: int, m: int, zero_bubble: bool
) -> list[Step]:
    """torch's `_get_1f1b_rank_ops` (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble)
    without its idle slots: warm-up forwards, 1F1B pairs walking the chunks a round at a time
    (forwards chunk 0 upwards, backwards from the last chunk down), then the cool-down
    backwards. Zero-bubble splits each backward into I and W and defers the W of rank r by r
    micro-batches, then drains the deferred Ws at the end."""
    _, per_round = _rounds(num_ranks, m)
    warmup = min((chunks - 1) * per_round + (1 if zero_bubble else 2) * (num_ranks - 1 - rank),
                 m * chunks)  # fmt: skip
    total = m * chunks  # forwards (and backwards) of this rank

    def fwd_stage(op: int) -> int:
        return (op // per_round) % chunks * num_ranks + rank

    def bwd_stage(op: int) -> int:
        return (chunks - 1 - ((op - warmup) // per_round) % chunks) * num_ranks + rank

    count: dict[tuple[str, int], int] = {}

    def take(kind: StepKind, stage: int) -> Step:
        k = count.get((kind, stage), 0)
        count[(kind, stage)] = k + 1
        return (kind, stage, k)

    out: list[Step] = []
    backward_ops: list[int] = []
    weights_done = 0
    for op in range(warmup + total):
        if op < total:
            out.append(take("F", fwd_stage(op)))
        if op >= warmup:
            out.append(take("I" if zero_bubble else "B", bwd_stage(op)))
            backward_ops.append(op)
            if zero_bubble and op - warmup >= rank:
                out.append(take("W", bwd_stage(backward_ops[weights_done])))
                weights_done += 1
    if zero_bubble:
        out += [take("W", bwd_stage(op)) for op in backward_ops[weights_done:]]
    return out


def interleaved_1f1b_order(rank: int, num_ranks: int, chunks: int, m: int) -> list[Step]:
    """ScheduleInterleaved1F1B (depth-first, Megatron's interleaving with torch's flexible m)."""
    return _interleaved_order(rank, num_ranks, chunks, m, zero_bubble=False)


def interleaved_zero_bubble_order(rank: int, num_ranks: int, chunks: int, m: int) -> list[Step]:
    """ScheduleInterleavedZeroBubble (ZB1P): interleaving with split backwards. At one chunk
    (`zbh1`) it is Qi et al.'s ZB-H1: 1F1B's warm-up, rank r's Ws deferred by r micro-batches
    into the drain."""
    return _interleaved_order(rank, num_ranks, chunks, m, zero_bubble=True)


def zbv_order(rank: int, num_ranks: int, chunks: int, m: int) -> list[Step]:
    """ScheduleZBVZeroBubble: torch's ZB-V generator. Down-stage `rank`, up-stage `2D - 1 - rank`;
    warm-up forwards, then (F, I, W) on each chunk in turn, then the cool-down Is with their Ws
    after. torch plans it for `max(m, 2D - 1)` micro-batches and drops the surplus."""
    d, r = num_ranks, rank
    n = max(2 * d - 1, m)
    s0, s1 = r, 2 * d - 1 - r
    out: list[Step] = []
    f0 = f1 = b0 = b1 = 0
    out += [("F", s0, f0 + i) for i in range(2 * (d - r) - 1)]
    f0 += 2 * (d - r) - 1
    for _ in range(r):
        out += [("F", s1, f1), ("F", s0, f0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(d - r):
        out += [("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            out.append(("F", s0, f0))
            f0 += 1
        out += [("I", s0, b0), ("W", s0, b0), ("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(r):
        out += [("I", s0, b0), ("I", s1, b1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(d - r):
        out += [("I", s0, b0), ("W", s0, w0)]
        b0, w0 = b0 + 1, w0 + 1
    out += [("W", s1, k) for k in range(w1, b1)] + [("W", s0, k) for k in range(w0, b0)]
    return [a for a in out if a[2] < m]


def dualpipev_order(rank: int, num_ranks: int, chunks: int, m: int) -> list[Step]:
    """ScheduleDualPipeV: torch's generator (DeepSeek's DualPipe, V-shaped). Its overlapped
    forward+backward pairs appear as the forward then the full backward (torch runs them in that
    order, on one stream)."""
    d, r = num_ranks, rank
    s0, s1 = r, 2 * d - 1 - r
    count: dict[tuple[str, int], int] = {}
    pending: list[tuple[int, int]] = []
    out: list[Step] = []

    def add(kind: StepKind, stage: int) -> None:
        key = ("I" if kind == "B" else kind, stage)
        k = count.get(key, 0)
        count[key] = k + 1
        out.append((kind, stage, k))
        if kind == "I":
            pending.append((stage, k))

    def weight() -> None:
        if pending:
            stage, k = pending.pop(0)
            out.append(("W", stage, k))

    for _ in range(2 * (d - r - 1)):
        add("F", s0)
    for _ in range(r + 1):
        add("F", s0)
        add("F", s1)
    for _ in range(d - r - 1):
        add("I", s1)
        weight()
        add("F", s1)
    for _ in range(m - 2 * d + r + 1):
        add("F", s0)
        add("B", s1)
        add("F", s1)
        add("B", s0)
    for _ in range(d - r - 1):
        add("B", s1)
        add("F", s1)
        add("B", s0)
    split = False
    for i in range(r + 1):
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        add("I" if split else "B", s1)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        add("I" if split else "B", s0)
    for _ in range(d - r - 1):
        weight()
        add("I" if split else "B", s0)
    for _ in range(r + 1):
        weight()
    return out


@dataclass(frozen=True, kw_only=True)
class ScheduleSpec:
    """What every layer needs to know about one pipeline schedule."""

    name: str
    """Name in plans, train specs and on the command line."""
    torch_class: str
    """Class in `torch.distributed.pipelining` the runtime builds."""
    micro_batches_per_stage: int
    """Micro-batches a pipeline must run per stage at least (1F1B: 1, so m >= S; 0: any m)."""
    bounded_in_flight: bool
    """A stage's in-flight micro-batches do not grow with m (1F1B, the interleaved and V
    schedules); otherwise it keeps all m (GPipe), so memory caps m."""
    timing_rule: str
    """Key of the fill/beat rule in `hetpp.cost.pipeline.TIMING_RULES`."""
    order: Callable[[int, int, int, int], list[Step]]
    """`order(rank, num_ranks, chunks, num_micro_batches)`: the compute steps of one of the
    pipeline's devices in order, torch's `pipeline_order[rank]` without idle slots and comms (the
    simulator adds the sends and receives around them)."""
    placement: Placement = "one"
    """Where the pipeline's stages run (`Placement`); "one" for single-chunk schedules."""
    rounds_divide_micro_batches: bool = False
    """torch's interleaved rule: with `rounds = max(1, m // D)` micro-batch rounds, m must be a
    multiple of `rounds`."""
    splits_backward: bool = False
    """Backwards run (some or all) as an input-grad part I and a weight-grad part W: a
    parameter's gradient is final only after the stage's last weight-grad action."""
    executable: bool = False
    """The runtime executes this schedule exactly (`hetpp.runtime.contract` refuses a plan
    naming one that it does not; the planner gives pipelines only these unless told otherwise)."""

    @property
    def multi_stage(self) -> bool:
        """torch runs it as a multi-stage schedule (a `_PipelineScheduleRuntime` on its lowered
        IR, the rank's stages as a list): several chunks per device, or a split backward, which
        torch's single-stage classes (1F1B, GPipe) have neither of. The planner shapes pipelines
        under the single-stage ones and tries these per pipeline in its schedule pass."""
        return self.placement != "one" or self.splits_backward

    def allows_chunks(self, chunks: int) -> bool:
        """Whether a pipeline may run `chunks` stages per device under this schedule."""
        return {"one": chunks == 1, "loop": chunks >= 2, "v": chunks == 2}[self.placement]

    def device_index(self, stage: int, num_devices: int) -> int:
        """Which of the pipeline's devices (0 = first) runs stage `stage`."""
        if self.placement == "loop":
            return stage % num_devices
        if self.placement == "v" and stage >= num_devices:
            return 2 * num_devices - 1 - stage
        return stage

    def min_micro_batches(self, num_stages: int) -> int:
        """Fewest micro-batches a pipeline of `num_stages` stages may run."""
        return max(1, self.micro_batches_per_stage * num_stages)

    def micro_batch_problem(self, num_stages: int, num_devices: int, m: int) -> str | None:
        """Why torch's schedule refuses `m` micro-batches on this pipeline, or None if it runs
        them (the plan check reports it)."""
        least = self.min_micro_batches(num_stages)
        if m < least:
            per = self.micro_batches_per_stage
            need = "stages" if per == 1 else f"{per} x stages"
            return f"{self.name.upper()} needs num_micro_batches >= {need} ({m} < {least})"
        rounds, _ = _rounds(num_devices, m)
        if self.rounds_divide_micro_batches and m % rounds:
            return (
                f"{self.name} needs num_micro_batches a multiple of its rounds max(1, m // "
                f"devices) = {rounds} (torch's {self.torch_class}); {m} is not"
            )
        return None

    @property
    def devices_within_batch(self) -> bool:
        """Every stage runs at least one micro-batch, so the devices a set of pipelines uses
        never outnumber the global batch's micro-batches (a budget for layout searches)."""
        return self.micro_batches_per_stage >= 1

    def in_flight(
        self, stage: int, num_stages: int, num_micro_batches: int, num_devices: int | None = None
    ) -> int:
        """Micro-batches whose activations stage `stage` holds at its device's peak (one chunk:
        the stage's own peak). A backward frees them; a split one at its W, which needs them."""
        if self.placement == "one" and not self.splits_backward:
            if self.bounded_in_flight:
                return min(num_micro_batches, num_stages - stage)
            return num_micro_batches
        d = num_devices or num_stages
        return _peak_holding(self.name, d, num_stages // d, num_micro_batches)[stage]


@functools.lru_cache(maxsize=4096)
def _peak_holding(name: str, num_ranks: int, chunks: int, m: int) -> dict[int, int]:
    """Per stage: the most micro-batches it holds at once (from the order). A device's stages
    peak at different moments; summing each one's own peak bounds the device's peak whatever
    bytes each stage's micro-batches hold (the count at the moment the device holds the most
    micro-batches does not: a stage of heavier micro-batches may peak elsewhere)."""
    spec = SCHEDULES[name]
    out: dict[int, int] = {}
    for rank in range(num_ranks):
        held: dict[int, int] = {}
        for kind, stage, _ in spec.order(rank, num_ranks, chunks, m):
            held[stage] = held.get(stage, 0) + (1 if kind == "F" else -1 if kind in "BW" else 0)
            out[stage] = max(out.get(stage, 0), held[stage])
    return out


SCHEDULES: dict[str, ScheduleSpec] = {
    s.name: s
    for s in (
        ScheduleSpec(
            name="1f1b",
            torch_class="Schedule1F1B",
            micro_batches_per_stage=1,
            bounded_in_flight=True,
            timing_rule="lockstep",
            order=one_f_one_b_order,
            executable=True,
        ),
        ScheduleSpec(
            name="gpipe",
            torch_class="ScheduleGPipe",
            micro_batches_per_stage=0,
            bounded_in_flight=False,
            timing_rule="flow-lines",
            order=gpipe_order,
            executable=True,
        ),
        ScheduleSpec(
            name="interleaved-1f1b",
            torch_class="ScheduleInterleaved1F1B",
            micro_batches_per_stage=0,
            bounded_in_flight=True,
            timing_rule="interleaved",
            order=interleaved_1f1b_order,
            placement="loop",
            rounds_divide_micro_batches=True,
            executable=True,
        ),
        ScheduleSpec(
            name="interleaved-zb",
            torch_class="ScheduleInterleavedZeroBubble",
            micro_batches_per_stage=0,
            bounded_in_flight=True,
            timing_rule="zero-bubble",
            order=interleaved_zero_bubble_order,
            placement="loop",
            rounds_divide_micro_batches=True,
            splits_backward=True,
            executable=True,
        ),
        ScheduleSpec(
            name="zbh1",
            torch_class="ScheduleInterleavedZeroBubble",
            micro_batches_per_stage=0,
            bounded_in_flight=True,
            timing_rule="zero-bubble",
            order=interleaved_zero_bubble_order,
            rounds_divide_micro_batches=True,
            splits_backward=True,
            executable=True,
        ),
        ScheduleSpec(
            name="zbv",
            torch_class="ScheduleZBVZeroBubble",
            micro_batches_per_stage=0,
            bounded_in_flight=True,
            timing_rule="zero-bubble-v",
            order=zbv_order,
            placement="v",
            splits_backward=True,
            executable=True,
        ),
        ScheduleSpec(
            name="dualpipev",
            torch_class="ScheduleDualPipeV",
            micro_batches_per_stage=1,
            bounded_in_flight=True,
            timing_rule="dualpipe-v",
            order=dualpipev_order,
            placement="v",
            splits_backward=True,
            executable=True,
        ),
    )
}
"""Every schedule by name; the first is the default."""

Schedule = Literal[tuple(SCHEDULES)]  # type: ignore[valid-type]
"""A schedule name (validated by pydantic against the registry)."""
