"""Pipeline schedules as plain data: per-rank lists of small actions that print as "2F0", "1B3".

The compute order of each rank is its schedule's entry in `hetpp.specs.schedule.SCHEDULES`
(torch.distributed.pipelining's own order; a torch-side test checks it). A rank may run several
stages (interleaved and V schedules). Each forward is preceded by the receive of its input and
followed by the send of its output, except where the neighbouring stage is the pipeline's end or
runs on the same rank (the V's turn); a backward (B, or the input-grad part I of a split one)
mirrors that in the other direction; a weight-grad part W is local. A rank joins the gradient
all-reduce of each bucket it owns right after the step that makes the bucket's gradients final
on it (its stage's last whole backward or weight-grad part), in the global bucket order (one
order on every rank, so collectives cannot deadlock; a bucket final before an earlier one of
the order joins after it), then, once all are done, steps its optimizer; with optimizer
sharding the all-reduces are reduce-scatters and the rank then joins each bucket's all-gather
of updated parameters, in forward order (`specs.plan.gather_order`). A sharded rank's
program is its step from the gradient norm's barrier on (`released`, as the runtime overlaps
the all-gathers with the next forward): the optimizer step and the all-gathers first, then its
schedule, each stage's first forward after a WAIT for the all-gathers of its buckets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

from hetpp.specs.schedule import SCHEDULES

ActionKind = Literal[
    "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "SYNC", "OPT", "GATHER", "WAIT"
]


class Action(NamedTuple):
    """One step of a rank's program.

    For F, B, I, W and the sends/receives `microbatch` is the micro-batch index; for SYNC it is the
    index of the gradient bucket (collective) in the plan's bucket list, for GATHER (optimizer
    sharding: the all-gather of a bucket's updated parameters) and WAIT (for that all-gather's
    end) that of its collective; OPT has none."""

    stage: int
    """Pipeline stage the action belongs to (for SYNC and OPT: the rank's first stage)."""
    kind: ActionKind
    microbatch: int | None = None

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{'' if self.microbatch is None else self.microbatch}"


def rank_actions(
    schedule: str,
    rank: int,
    num_ranks: int,
    num_micro_batches: int,
    chunks: int = 1,
    buckets: Sequence[tuple[int, int | None]] = (),
    optimizer: bool = True,
    gathers: Sequence[int] = (),
    released: Mapping[int, Sequence[int]] | None = None,
) -> list[Action]:
    """The whole program of one of a pipeline's `num_ranks` devices: its schedule's compute
    order (the registry entry's, each step with its transfers), a SYNC per bucket it owns,
    `(collective, stage)` in the order given, each right after the stage's last step writing
    weight gradients (None: after all its compute) and not before the SYNC ahead of it, then
    the optimizer step, then (optimizer sharding) a GATHER per bucket it owns. With `released`
    (stage -> the GATHERs its forwards read) the optimizer step and the GATHERs come first
    instead, the step counted from the barrier, and a WAIT for each stage's GATHERs precedes its
    first forward."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    spec = SCHEDULES[schedule]
    last = num_ranks * chunks - 1

    def remote(stage: int) -> bool:  # a neighbour stage that exists and runs elsewhere
        return 0 <= stage <= last and spec.device_index(stage, num_ranks) != rank

    out: list[Action] = []
    final: dict[int, int] = {}  # stage -> how many actions precede its SYNCs
    waits = {s: [Action(s, "WAIT", c) for c in cs] for s, cs in (released or {}).items()}
    for kind, s, k in spec.order(rank, num_ranks, chunks, num_micro_batches):
        if kind == "F":
            out += [Action(s, "RECV_F", k)] if remote(s - 1) else []
            out += waits.pop(s, [])
            out.append(Action(s, "F", k))
            out += [Action(s, "SEND_F", k)] if remote(s + 1) else []
        elif kind in ("B", "I"):
            out += [Action(s, "RECV_B", k)] if remote(s + 1) else []
            out.append(Action(s, kind, k))
            out += [Action(s, "SEND_B", k)] if remote(s - 1) else []
            if kind == "B":  # after the step and its transfer (both asynchronous)
                final[s] = len(out)
        else:  # W
            out.append(Action(s, kind, k))
            final[s] = len(out)
    at, syncs = 0, {}
    for c, stage in buckets:
        at = max(at, len(out) if stage is None else final[stage])
        syncs.setdefault(at, []).append(Action(rank, "SYNC", c))
    out = [a for i in range(len(out) + 1) for a in (*syncs.get(i, ()), *out[i : i + 1])]
    tail = [Action(rank, "OPT")] if optimizer else []
    tail += [Action(rank, "GATHER", c) for c in gathers]
    return tail + out if released is not None else out + tail


def format_actions(actions: Sequence[Action]) -> list[str]:
    """The actions as short strings, for tests and debugging."""
    return [str(a) for a in actions]
