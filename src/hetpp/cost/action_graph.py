"""A pipeline's time as the longest path through its schedule's action graph.

The nodes are the steps every device runs in its schedule's order (`ScheduleSpec.order`, the
order the simulator and torch run) and the transfers between devices; a step starts when the
device's previous one has ended and (a receiving step) its message has arrived; a transfer
starts when its step has ended and its link (one direction between two devices) is free of the
transfer issued before it. That is the event simulator's rule for one pipeline, so the longest
path is its time, without an event queue or clocks: the graph depends on the schedule, the
device count, the chunks and the micro-batches only, and is built and put in topological order
once per such structure (cached); a call runs one pass over it on the stage times, each node
the later of its two predecessors plus its own seconds.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hetpp.specs.schedule import SCHEDULES

PARTS = {"F": 0, "I": 1, "W": 2, "B": 3}
"""Index of a compute step's part in a stage's `[f, i, w, b]` times (a whole backward B takes
`b`; DualPipeV runs some whole and some split)."""


class ActionGraph(NamedTuple):
    """One pipeline structure's graph, its nodes in topological order (`graph`). Node 0 is the
    step's start (time 0); node n + 1 is the n-th of the lists below."""

    first: list[int]
    """Per node, its predecessor on the same device (a step) or the step it sends (a transfer)."""
    second: list[int]
    """Per node, the transfer a step receives, or the transfer issued before it on its link
    (0 where none)."""
    took: np.ndarray
    """Per node, the index of its seconds in `[f, i, w, b] per stage, 0, hop per boundary]`."""
    ends: np.ndarray
    """Per device, the node of its last step."""
    grads: np.ndarray
    """Per stage, the node of its last whole backward or weight-grad step: its parameter
    gradients are final when it ends (its bucket's sync may start)."""


class PathEnds(NamedTuple):
    """What the step cost reads off one longest-path pass (`path_ends_s`)."""

    devices_s: np.ndarray
    """Per device, when it ends its last step."""
    grads_final_s: np.ndarray
    """Per stage, when its parameter gradients are final (the end of its last B or W)."""


def _steps(spec, num_devices: int, chunks: int, m: int) -> list[list[tuple]]:
    """Per device its steps in order as `(weight index, message received or None, (link,
    message) sent or None)`; a message is `(boundary, backward, micro-batch)`. A forward sends
    to the next stage, a backward (or its input-grad part) to the previous one, where that
    stage runs on another device (`rank_actions`' rule)."""
    num, where = num_devices * chunks, spec.device_index
    out = []
    for d in range(num_devices):
        steps = []
        for kind, s, mb in spec.order(d, num_devices, chunks, m):
            got = sent = None
            if kind != "W":
                back = kind != "F"
                frm, to = (s + 1, s - 1) if back else (s - 1, s + 1)
                if 0 <= frm < num and where(frm, num_devices) != d:
                    got = (min(frm, s), back, mb)
                if 0 <= to < num and where(to, num_devices) != d:
                    sent = ((d, where(to, num_devices)), (min(to, s), back, mb))
            steps.append((4 * s + PARTS[kind], got, sent))
        out.append(steps)
    return out


@functools.lru_cache(maxsize=256)
def graph(schedule: str, num_devices: int, chunks: int, m: int) -> ActionGraph:
    """The action graph of `schedule` on `num_devices` devices with `chunks` stages each and
    `m` micro-batches, in topological order: each device runs its steps until one waits for a
    message not yet sent, as the simulator's ranks do but without clocks; a transfer follows
    the step it carries at once (the one before it on its link came from an earlier step of
    the same device)."""
    num = num_devices * chunks
    programs = _steps(SCHEDULES[schedule], num_devices, chunks, m)
    first, second, took = [], [], []
    carried: dict[tuple, int] = {}  # message -> its transfer's node
    on_link: dict[tuple, int] = {}  # link -> its latest transfer's node
    last, pc = [0] * num_devices, [0] * num_devices
    grads = [0] * num
    moved = True
    while moved:
        moved = False
        for d, steps in enumerate(programs):
            i = pc[d]
            while i < len(steps) and (steps[i][1] is None or steps[i][1] in carried):
                part, got, sent = steps[i]
                first.append(last[d])
                second.append(carried[got] if got else 0)
                took.append(part)
                last[d] = len(first)
                if part % 4 in (PARTS["W"], PARTS["B"]):
                    grads[part // 4] = last[d]
                if sent:
                    link, msg = sent
                    first.append(last[d])
                    second.append(on_link.get(link, 0))
                    took.append(4 * num + 1 + msg[0])
                    carried[msg] = on_link[link] = len(first)
                i += 1
            moved |= i > pc[d]
            pc[d] = i
    if pc != [len(p) for p in programs]:
        raise ValueError(f"{schedule}: the order deadlocks on {num_devices} devices, m = {m}")
    return ActionGraph(first, second, np.array(took), np.array(last), np.array(grads))


def path_ends_s(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    comm_s: Sequence[float],
    num_micro_batches: int,
    schedule: str,
    num_devices: int,
    weight_s: Sequence[float],
) -> PathEnds:
    """When each device ends its last step and each stage's gradients are final: the longest
    paths to those nodes through the action graph (the pipeline's time is the largest end).
    `comm_s[s]` is the hop between stages s and s+1 (both directions), `weight_s[s]` the W part
    of stage s's backward (read by split-backward schedules only)."""
    g = graph(schedule, num_devices, len(fwd_s) // num_devices, num_micro_batches)
    f, b = np.asarray(fwd_s, dtype=float), np.asarray(bwd_s, dtype=float)
    w = np.asarray(weight_s, dtype=float) if SCHEDULES[schedule].splits_backward else 0.0 * b
    seconds = np.concatenate([np.stack([f, b - w, w, b], axis=1).ravel(), [0.0], comm_s])
    t = [0.0]
    for p, q, x in zip(g.first, g.second, seconds[g.took].tolist()):
        a, c = t[p], t[q]
        t.append((a if a > c else c) + x)
    t = np.array(t)
    return PathEnds(t[g.ends], t[g.grads])
