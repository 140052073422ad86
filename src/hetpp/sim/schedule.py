"""Pipeline schedules as plain data: per-rank lists of small actions that print as "2F0", "1B3".

The compute order of each stage is its schedule's entry in `hetpp.specs.schedule.SCHEDULES`
(the order torch.distributed.pipelining runs; a torch-side test checks it). Each forward is
preceded by the receive of its input (except on the first stage) and followed by the send of its
output (except on the last stage); backwards mirror that in the other direction. After its last
backward a rank joins the gradient all-reduces of the buckets it owns, in the global bucket order
(one order on every rank, so collectives cannot deadlock), then steps its optimizer; with
optimizer sharding the all-reduces are reduce-scatters and the rank then joins each bucket's
all-gather of updated parameters, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

from hetpp.specs.schedule import SCHEDULES

ActionKind = Literal["F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "SYNC", "OPT", "GATHER"]


class Action(NamedTuple):
    """One step of a rank's program.

    For F, B and the sends/receives `microbatch` is the micro-batch index; for SYNC it is the
    index of the gradient bucket (collective) in the plan's bucket list, for GATHER (optimizer
    sharding: the all-gather of a bucket's updated parameters) that of its collective; OPT has
    none."""

    stage: int
    """Pipeline stage of the rank doing the action."""
    kind: ActionKind
    microbatch: int | None = None

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{'' if self.microbatch is None else self.microbatch}"


def _forward(stage: int, num_stages: int, k: int) -> list[Action]:
    out = [Action(stage, "RECV_F", k)] if stage > 0 else []
    out.append(Action(stage, "F", k))
    if stage < num_stages - 1:
        out.append(Action(stage, "SEND_F", k))
    return out


def _backward(stage: int, num_stages: int, k: int) -> list[Action]:
    out = [Action(stage, "RECV_B", k)] if stage < num_stages - 1 else []
    out.append(Action(stage, "B", k))
    if stage > 0:
        out.append(Action(stage, "SEND_B", k))
    return out


def stage_actions(
    schedule: str,
    stage: int,
    num_stages: int,
    num_micro_batches: int,
    buckets: Sequence[int] = (),
    optimizer: bool = True,
    gathers: Sequence[int] = (),
) -> list[Action]:
    """The whole program of one rank: its pipeline schedule (the registry entry's order, each
    step with its transfers), then a SYNC per bucket it owns (in the order given), then the
    optimizer step, then (optimizer sharding) a GATHER per bucket it owns."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    out: list[Action] = []
    for kind, k in SCHEDULES[schedule].order(stage, num_stages, num_micro_batches):
        step = _forward if kind == "F" else _backward
        out += step(stage, num_stages, k)
    out += [Action(stage, "SYNC", b) for b in buckets]
    if optimizer:
        out.append(Action(stage, "OPT"))
    out += [Action(stage, "GATHER", c) for c in gathers]
    return out


def format_actions(actions: Sequence[Action]) -> list[str]:
    """The actions as short strings, for tests and debugging."""
    return [str(a) for a in actions]
