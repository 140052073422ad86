"""Pipeline schedules as data: one registry entry per schedule, read by every layer.

The planner asks an entry how many micro-batches a pipeline needs and how many each stage keeps
in flight; the cost model looks up the entry's timing rule (`hetpp.cost.pipeline.TIMING_RULES`);
the simulator expands its per-stage order into actions; the runtime builds its torch class.
Adding a schedule is one entry here plus its timing rule there, if it needs a new one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Step = tuple[Literal["F", "B"], int]
"""One compute step of a stage: forward or backward of a micro-batch."""

Placement = Literal["one", "loop", "v"]
"""How a schedule places a pipeline's stages on its devices: "one" stage per device; "loop":
stage i on device i mod D (interleaved schedules, several chunks per device); "v": two chunks per
device, stage i on device i going down and on device 2D - 1 - i coming back (ZBV, DualPipeV)."""


def gpipe_order(stage: int, num_stages: int, num_micro_batches: int) -> list[Step]:
    """ScheduleGPipe: all forwards, then all backwards in micro-batch order."""
    m = num_micro_batches
    return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]


def one_f_one_b_order(stage: int, num_stages: int, num_micro_batches: int) -> list[Step]:
    """Schedule1F1B: `S - s - 1` warm-up forwards, then 1F/1B pairs, then the cool-down
    backwards (torch runs `S - s` warm-up forwards and then 1B1F pairs: the same order).

    Stage s therefore holds at most `min(m, S - s)` micro-batches' activations at once."""
    m = num_micro_batches
    warmup = min(m, num_stages - stage - 1)
    out: list[Step] = [("F", k) for k in range(warmup)]
    for i in range(m - warmup):
        out += [("F", warmup + i), ("B", i)]
    return out + [("B", i) for i in range(m - warmup, m)]


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
    """Stage s keeps at most `S - s` micro-batches in flight (1F1B), so its memory does not
    grow with m; otherwise it keeps all m (GPipe), so memory caps m."""
    timing_rule: str
    """Key of the fill/beat rule in `hetpp.cost.pipeline.TIMING_RULES`."""
    order: Callable[[int, int, int], list[Step]]
    """`order(stage, num_stages, num_micro_batches)`: the stage's compute steps in order (the
    simulator adds the sends and receives around them)."""
    placement: Placement = "one"
    """Where the pipeline's stages run (`Placement`); "one" for single-chunk schedules."""
    splits_backward: bool = False
    """Backward runs as two actions, input-grad then weight-grad (zero-bubble schedules): a
    parameter's gradient is final only after the stage's last weight-grad action."""
    executable: bool = False
    """The runtime executes this schedule exactly (`hetpp.runtime.contract` refuses a plan
    naming one that it does not)."""

    def allows_chunks(self, chunks: int) -> bool:
        """Whether a pipeline may run `chunks` stages per device under this schedule."""
        return {"one": chunks == 1, "loop": chunks >= 1, "v": chunks == 2}[self.placement]

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

    @property
    def devices_within_batch(self) -> bool:
        """Every stage runs at least one micro-batch, so the devices a set of pipelines uses
        never outnumber the global batch's micro-batches (a budget for layout searches)."""
        return self.micro_batches_per_stage >= 1

    def in_flight(self, stage: int, num_stages: int, num_micro_batches: int) -> int:
        """Micro-batches whose activations stage `stage` holds at once."""
        if self.bounded_in_flight:
            return min(num_micro_batches, num_stages - stage)
        return num_micro_batches


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
        # Multi-chunk schedules. Their timing rule, in-flight bound and order are the 1F1B ones
        # for now, placeholders that the planning half of issue 13 (sched-plan) replaces with
        # each schedule's own; the runtime reads only torch_class, placement, splits_backward
        # and executable. m >= stages (every virtual stage) is what torch's ZBV needs to fill
        # its V (it builds max(2D - 1, m) micro-batches' actions); the interleaved schedules'
        # rounds rule is checked by `hetpp.runtime.contract`.
        ScheduleSpec(
            name="interleaved-1f1b",
            torch_class="ScheduleInterleaved1F1B",
            micro_batches_per_stage=1,
            bounded_in_flight=True,
            timing_rule="lockstep",
            order=one_f_one_b_order,
            placement="loop",
            executable=True,
        ),
        ScheduleSpec(
            name="interleaved-zb",
            torch_class="ScheduleInterleavedZeroBubble",
            micro_batches_per_stage=1,
            bounded_in_flight=True,
            timing_rule="lockstep",
            order=one_f_one_b_order,
            placement="loop",
            splits_backward=True,
            executable=True,
        ),
        ScheduleSpec(
            name="zbv",
            torch_class="ScheduleZBVZeroBubble",
            micro_batches_per_stage=1,
            bounded_in_flight=True,
            timing_rule="lockstep",
            order=one_f_one_b_order,
            placement="v",
            splits_backward=True,
            executable=True,
        ),
    )
}
"""Every schedule by name; the first is the default."""

Schedule = Literal[tuple(SCHEDULES)]  # type: ignore[valid-type]
"""A schedule name (validated by pydantic against the registry)."""
