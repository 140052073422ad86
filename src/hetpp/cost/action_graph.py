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
import itertools
import operator
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hetpp.specs.schedule import SCHEDULES

PARTS = {"F": 0, "I": 1, "W": 2, "B": 3}
"""Index of a compute step's part in a stage's `[f, i, w, b]` times (a whole backward B takes
`b`; DualPipeV runs some whole and some split)."""


_KIND_CODES = np.zeros(128, dtype=int)
_KIND_CODES[[ord(kind) for kind in PARTS]] = list(PARTS.values())
"""`PARTS` indexed by the kind's character code."""


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


class _Steps(NamedTuple):
    """Every device's steps, device after device, each device's in its order (-1: none)."""

    device: np.ndarray
    """Per step, its device."""
    part: np.ndarray
    """Per step, the index of its seconds (`4 * stage + PARTS[kind]`)."""
    got: np.ndarray
    """Per step, the message it receives, or -1. A message, `(2 * boundary + backward) * span +
    micro-batch`, is one boundary's activation (or gradient) of one micro-batch."""
    link: np.ndarray
    """Per step, the link its message goes on (`sender * devices + receiver`), or -1."""
    sent: np.ndarray
    """Per step, the message it sends, or -1."""
    span: int
    """Micro-batch numbers per boundary and direction in a message (m, or more where an order
    numbers past m: torch's interleaved order for an m its rounds do not divide)."""


def _steps(spec, num_devices: int, chunks: int, m: int) -> _Steps:
    """The steps of every device in its order with what each receives and sends. A forward
    sends to the next stage, a backward (or its input-grad part) to the previous one, where that
    stage runs on another device (`rank_actions`' rule)."""
    num = num_devices * chunks
    # the device of stages -1 .. num (the two ends: none, never "another device")
    dev = np.array([-1] + [spec.device_index(s, num_devices) for s in range(num)] + [-1])
    d, kind, s, mb = order_columns(spec.name, num_devices, chunks, m)
    span = max(m, int(mb.max(initial=0)) + 1)
    back = (kind != PARTS["F"]).astype(int)
    step = kind != PARTS["W"]
    frm, to = s + 1 - 2 * (1 - back), s - 1 + 2 * (1 - back)
    got_dev, to_dev = dev[frm + 1], dev[to + 1]
    sends = step & (to_dev >= 0) & (to_dev != d)
    gets = step & (got_dev >= 0) & (got_dev != d)
    return _Steps(
        device=d,
        part=4 * s + kind,
        got=np.where(gets, (2 * np.minimum(frm, s) + back) * span + mb, -1),
        link=np.where(sends, d * num_devices + to_dev, -1),
        sent=np.where(sends, (2 * np.minimum(to, s) + back) * span + mb, -1),
        span=span,
    )


@functools.lru_cache(maxsize=512)
def order_columns(schedule: str, num_devices: int, chunks: int, m: int) -> np.ndarray:
    """Every device's steps in `schedule`'s order (`ScheduleSpec.order`) as four int columns
    (device, `PARTS` index of the kind, stage, micro-batch), one row per step, device after
    device; memoized and read-only: the action graph and the memory replay
    (`memory._holding_states`) of one structure both read them."""
    spec = SCHEDULES[schedule]
    orders = [spec.order(d, num_devices, chunks, m) for d in range(num_devices)]
    steps = list(itertools.chain.from_iterable(orders))
    # a column at a time through C iterators (the kinds as one string's bytes): no per-step
    # Python tuple or list is built
    kinds = np.frombuffer("".join(map(operator.itemgetter(0), steps)).encode(), dtype=np.uint8)
    out = np.stack(
        [
            np.repeat(np.arange(num_devices), [len(order) for order in orders]),
            _KIND_CODES[kinds],
            np.fromiter(map(operator.itemgetter(1), steps), dtype=int, count=len(steps)),
            np.fromiter(map(operator.itemgetter(2), steps), dtype=int, count=len(steps)),
        ]
    )
    out.flags.writeable = False
    return out


def _edges(steps: _Steps, num: int) -> tuple[np.ndarray, ...]:
    """(first, second, took) per node, nodes numbered steps first (1 .., in `steps`' order)
    then their transfers (in the same order); a step a device runs first follows node 0, a
    message nobody sends comes from node `len(first) + 1` (never reached: a deadlock)."""
    n = len(steps.part)
    carries = np.flatnonzero(steps.sent >= 0)  # the steps that send
    xfer = n + 1 + np.arange(len(carries))  # their transfers' nodes
    step_node = np.arange(1, n + 1)
    prev = np.where(np.r_[True, steps.device[1:] != steps.device[:-1]], 0, step_node - 1)
    carrier = np.full(2 * num * steps.span, n + len(carries) + 1)
    carrier[steps.sent[carries]] = xfer
    arrival = np.where(steps.got >= 0, carrier[steps.got], 0)
    # the transfer issued before each on its link: one device sends on a link, in its order
    by_link = np.lexsort((carries, steps.link[carries]))
    link_sorted = steps.link[carries][by_link]
    before = np.zeros(len(carries), dtype=int)
    same = np.flatnonzero(link_sorted[1:] == link_sorted[:-1])
    before[by_link[same + 1]] = xfer[by_link[same]]
    hop = 4 * num + 1 + steps.sent[carries] // (2 * steps.span)
    first = np.concatenate([prev, step_node[carries]])
    second = np.concatenate([arrival, before])
    took = np.concatenate([steps.part, hop])
    return first, second, took, carries, xfer


@functools.lru_cache(maxsize=256)
def graph(schedule: str, num_devices: int, chunks: int, m: int) -> ActionGraph:
    """The action graph of `schedule` on `num_devices` devices with `chunks` stages each and
    `m` micro-batches, in topological order: each device runs its steps until one waits for a
    message not yet sent, as the simulator's ranks do but without clocks; a transfer follows
    the step it carries at once (the one before it on its link came from an earlier step of
    the same device)."""
    num = num_devices * chunks
    steps = _steps(SCHEDULES[schedule], num_devices, chunks, m)
    first, second, took, carries, xfer = _edges(steps, num)
    order = _wavefront(steps, second, carries, xfer, num_devices)
    if order is None:
        raise ValueError(f"{schedule}: the order deadlocks on {num_devices} devices, m = {m}")
    rank = np.zeros(len(first) + 1, dtype=int)  # node -> its place in the topological order
    rank[order] = np.arange(1, len(order) + 1)
    first, second = rank[first[order - 1]].tolist(), rank[second[order - 1]].tolist()
    took = took[order - 1]
    starts = np.searchsorted(steps.device, np.arange(num_devices + 1))
    ends = rank[starts[1:] * (np.diff(starts) > 0)]
    is_grad = steps.part % 4 >= PARTS["W"]  # a W or a whole B: the stage's last is its grads'
    grads = np.zeros(num, dtype=int)  # (a device's steps come later in the order, one by one)
    np.maximum.at(grads, steps.part[is_grad] // 4, rank[np.flatnonzero(is_grad) + 1])
    return ActionGraph(first, second, took, ends, grads)


def _wavefront(
    steps: _Steps, second: np.ndarray, carries: np.ndarray, xfer: np.ndarray, num_devices: int
) -> np.ndarray | None:
    """The nodes in a topological order, None if it deadlocks: device after device, each runs
    its steps (each followed by the transfer it sends) until one receives a message its sender
    has not run yet, and again until none moves. The loop visits receiving steps only: the steps
    between two run as one slice of the device's nodes."""
    n = len(steps.part)
    sends = np.zeros(n, dtype=int)
    sends[carries] = 1
    # `seq`: every step's node followed by its transfer's; `pos[i]`: step i's place in it
    pos = np.concatenate([[0], np.cumsum(1 + sends)])
    seq = np.zeros(pos[-1], dtype=int)
    seq[pos[:-1]] = np.arange(1, n + 1)
    seq[pos[carries] + 1] = xfer
    # per receiving step, the step that sends its message and that one's device (a message
    # nobody sends: step n on device 0, which never runs past n)
    recv = np.flatnonzero(steps.got >= 0)
    sender = np.append(carries, n)[second[recv] - n - 1]
    sender_dev = np.append(steps.device, 0)[sender]
    starts = np.searchsorted(steps.device, np.arange(num_devices + 1)).tolist()
    recv_at = np.searchsorted(recv, starts).tolist()
    recv, sender, sender_dev = recv.tolist(), sender.tolist(), sender_dev.tolist()
    pc, k_at, pieces = starts[:-1], recv_at[:-1], []
    moved = True
    while moved:
        moved = False
        for d in range(num_devices):
            k, stop = k_at[d], recv_at[d + 1]
            while k < stop and pc[sender_dev[k]] > sender[k]:
                k += 1  # its message was sent: the device runs past it
            i = recv[k] if k < stop else starts[d + 1]
            if i > pc[d]:
                pieces.append(seq[pos[pc[d]] : pos[i]])
                pc[d], k_at[d], moved = i, k, True
    if pc != starts[1:]:
        return None
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=int)


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
