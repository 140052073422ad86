"""Discrete-event engine: runs per-rank action lists with the dependencies between ranks.

Resources and rules:
- each rank runs its actions in order on one compute stream (F, B, I, W, OPT take their time);
  a rank may run several pipeline stages (interleaved and V schedules), each with its own times
  and neighbours;
- a send is asynchronous: the message occupies the (sender, receiver) link, one direction, from
  `max(send issued, link free)` for the link's time; the sender goes on at once;
- a receive completes when its message has arrived (the rank waits until then);
- a collective runs on its members' communication streams, one collective at a time per rank in
  the order the rank reached them: it starts when the last member has reached it and every
  member is done with the collectives it reached before, and ends for all of them together,
  `duration_s` later. A SYNC (gradient all-reduce) is asynchronous: the rank computes on while
  it runs, as the runtime's overlapped bucket all-reduces do; OPT waits until every collective
  the rank reached has ended; a GATHER (the all-gather of updated parameters after the
  optimizer step) is asynchronous too, and a WAIT for it (before a stage's first forward that
  reads those parameters) blocks the rank until it has ended.

Ranks are taken from a heap ordered by their clock and each runs until it blocks. That is exact
here because no resource has two users whose order depends on timing: a link direction has one
sender (which issues in program order) and a collective's start is a max over its members'
arrival and stream times. A rank that can never proceed is reported as a Deadlock, never waited
on.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hetpp.sim.schedule import Action
from hetpp.sim.trace import Kind, Trace, Transfers, empty_transfers


@dataclass(frozen=True, slots=True)
class StageWork:
    """One pipeline stage a rank runs: its compute times and the ranks of its neighbours."""

    fwd_s: float
    """Seconds of each forward (F)."""
    bwd_s: float
    """Seconds of each full backward (B)."""
    weight_s: float = 0.0
    """Seconds of the weight-grad part (W) of a split backward; its input-grad part (I) takes
    the rest of `bwd_s`."""
    prev: int | None = None
    """Program index of the rank running the previous stage (source of RECV_F, target of
    SEND_B); None for the first stage."""
    next: int | None = None
    """Program index of the rank running the next stage (target of SEND_F, source of RECV_B)."""
    send_next_s: float = 0.0
    """Link time of one activation to the next stage."""
    send_prev_s: float = 0.0
    """Link time of one gradient to the previous stage."""


@dataclass(frozen=True, slots=True)
class RankProgram:
    """One rank's actions and what its stages' actions take."""

    actions: tuple[Action, ...]
    stages: Mapping[int, StageWork]
    """The stages the rank runs, by the stage index its actions name."""
    opt_s: float = 0.0
    """Seconds of the optimizer step (OPT)."""
    name: str = ""
    """How reports and errors name the rank (e.g. 'device 5')."""


@dataclass(frozen=True, slots=True)
class Collective:
    """An all-reduce (reduce-scatter) that SYNC actions with its index join, or an all-gather
    that GATHER actions join."""

    members: tuple[int, ...]
    """Program indices of the ranks taking part."""
    duration_s: float
    gather: bool = False
    """An all-gather of updated parameters after the optimizer step (recorded as GATHER)."""


class ScheduleError(ValueError):
    """The action lists are malformed (a send with no peer, a stray message, a bad bucket)."""


class Deadlock(ScheduleError):
    """Some ranks wait for something that never comes; `blocked` says who waits for what."""

    def __init__(self, blocked: list[str]):
        self.blocked = blocked
        shown = "; ".join(blocked[:8]) + (
            f"; ... {len(blocked) - 8} more" if len(blocked) > 8 else ""
        )
        super().__init__(f"deadlock: {len(blocked)} rank(s) can never proceed: {shown}")


def _name(programs: Sequence[RankProgram], r: int) -> str:
    return programs[r].name or f"rank {r}"


_COLLECTIVE = ("SYNC", "GATHER")
"""Action kinds that join a collective (its index in `microbatch`)."""


def _check(programs: Sequence[RankProgram], collectives: Sequence[Collective]) -> None:
    for r, prog in enumerate(programs):
        reached = set()  # a WAIT only for an all-gather the rank joined before it
        for a in prog.actions:
            work = prog.stages.get(a.stage)
            if a.kind == "GATHER":
                reached.add(a.microbatch)
            if a.kind in _COLLECTIVE:
                bad = (
                    a.microbatch is None
                    or not 0 <= a.microbatch < len(collectives)
                    or r not in collectives[a.microbatch].members
                    or collectives[a.microbatch].gather != (a.kind == "GATHER")
                )
            elif a.kind == "WAIT":
                bad = (
                    a.microbatch is None
                    or not 0 <= a.microbatch < len(collectives)
                    or not collectives[a.microbatch].gather
                    or a.microbatch not in reached
                )
            elif a.kind == "OPT":
                bad = False
            else:
                bad = (
                    work is None
                    or (a.kind in ("SEND_F", "RECV_B") and work.next is None)
                    or (a.kind in ("RECV_F", "SEND_B") and work.prev is None)
                )
            if bad:
                raise ScheduleError(f"{_name(programs, r)}: action {a} has no peer or collective")


_COMPUTE = {"F": Kind.F, "B": Kind.B, "I": Kind.I, "W": Kind.W}


class _Run:
    """Mutable state of one run (kept out of the public types)."""

    def __init__(self, programs: Sequence[RankProgram], collectives: Sequence[Collective]):
        self.programs, self.collectives = programs, collectives
        n = len(programs)
        self.pc = [0] * n
        self.clock = [0.0] * n
        self.heap = [(0.0, r) for r in range(n)]
        self.arrived: dict[tuple, float] = {}
        self.waiting: dict[tuple, int] = {}
        self.link_free: dict[tuple[int, int], float] = {}
        self.coll_count = [0] * len(collectives)
        self.coll_ready = [0.0] * len(collectives)
        self.coll_end: list[float | None] = [None] * len(collectives)
        self.queue: list[deque[int]] = [deque() for _ in range(n)]
        """Per rank, the collectives it reached that have not run yet, in order."""
        self.stream_free = [0.0] * n
        """Per rank, when its communication stream is done with the collectives that ran."""
        self.reached: list[set[int]] = [set() for _ in range(n)]
        self.intervals: list[tuple[int, int, int, float, float, int]] = []
        self.transfers: list[tuple[int, int, int, int, float, float]] = []

    def send(
        self, src: int, dst: int, grad: int, stage: int, mb: int, t: float, dur: float
    ) -> None:
        key = (src, dst, grad, stage, mb)
        if key in self.arrived:
            raise ScheduleError(f"{_name(self.programs, src)} sends {key} twice")
        start = max(t, self.link_free.get((src, dst), 0.0))
        end = start + dur
        self.link_free[(src, dst)] = end
        self.transfers.append((src, dst, grad, mb, start, end))
        self.arrived[key] = end
        w = self.waiting.pop(key, None)
        if w is not None:
            heapq.heappush(self.heap, (max(self.clock[w], end), w))

    def join(self, r: int, c: int, t: float) -> None:
        """Rank r reaches collective c at t (its stream takes it after what it reached before);
        then run every collective that can now start."""
        self.coll_count[c] += 1
        self.coll_ready[c] = max(self.coll_ready[c], t)
        self.queue[r].append(c)
        todo = [c]
        while todo:
            c = todo.pop()
            coll = self.collectives[c]
            members = coll.members
            if (
                self.coll_end[c] is not None  # ran already (looked at twice)
                or self.coll_count[c] < len(members)
                or any(self.queue[m][0] != c for m in members)
            ):
                continue
            start = max(self.coll_ready[c], *(self.stream_free[m] for m in members))
            end = self.coll_end[c] = start + coll.duration_s
            kind = Kind.GATHER if coll.gather else Kind.SYNC
            for m in members:
                self.intervals.append((m, kind, c, start, end, -1))
                self.queue[m].popleft()
                self.stream_free[m] = end
                if self.queue[m]:
                    todo.append(self.queue[m][0])
                elif m != r:  # it may wait at OPT or WAIT for its stream: let it look again
                    heapq.heappush(self.heap, (max(self.clock[m], end), m))

    def step_rank(self, r: int) -> None:
        """Run rank r from its current action until it blocks or finishes."""
        prog = self.programs[r]
        acts, i, t = prog.actions, self.pc[r], self.clock[r]
        rec = self.intervals.append
        while i < len(acts):
            stage, kind, mb = acts[i]
            work = prog.stages.get(stage)
            if kind in _COMPUTE:
                dur = {
                    "F": work.fwd_s,
                    "B": work.bwd_s,
                    "I": work.bwd_s - work.weight_s,
                    "W": work.weight_s,
                }[kind]
                rec((r, _COMPUTE[kind], mb, t, t + dur, stage))
                t += dur
            elif kind == "SEND_F":
                self.send(r, work.next, 0, stage, mb, t, work.send_next_s)
            elif kind == "SEND_B":
                self.send(r, work.prev, 1, stage, mb, t, work.send_prev_s)
            elif kind in ("RECV_F", "RECV_B"):
                key = (
                    (work.prev, r, 0, stage - 1, mb)
                    if kind == "RECV_F"
                    else (work.next, r, 1, stage + 1, mb)
                )
                at = self.arrived.pop(key, None)
                if at is None:
                    self.waiting[key] = r
                    break
                t = max(t, at)
            elif kind in _COLLECTIVE:
                if mb not in self.reached[r]:  # not when it looks again after waiting
                    self.reached[r].add(mb)
                    self.join(r, mb, t)
            elif kind == "WAIT":
                if self.coll_end[mb] is None:
                    break
                t = max(t, self.coll_end[mb])
            elif kind == "OPT":
                if self.queue[r]:
                    break
                t = max(t, self.stream_free[r])
                rec((r, Kind.OPT, -1, t, t + prog.opt_s, -1))
                t += prog.opt_s
            else:
                raise ScheduleError(f"{_name(self.programs, r)}: unknown action {acts[i]}")
            i += 1
        self.pc[r], self.clock[r] = i, t

    def blocked(self) -> list[str]:
        """Who waits for what: a message, or the collective at the head of its stream."""
        out = []
        for r, prog in enumerate(self.programs):
            done = self.pc[r] >= len(prog.actions)
            if done and not self.queue[r]:
                continue
            a = None if done else prog.actions[self.pc[r]]
            if a is None or a.kind in (*_COLLECTIVE, "OPT", "WAIT"):
                c = self.queue[r][0] if self.queue[r] else a.microbatch
                coll = self.collectives[c]
                missing = [  # members that have not reached it, or have another one before it
                    _name(self.programs, m)
                    for m in coll.members
                    if not (self.queue[m] and self.queue[m][0] == c)
                ]
                what = "all-gather" if coll.gather else "all-reduce"
                why = f"{what} {c} still needs {', '.join(missing)}"
            else:
                work = prog.stages[a.stage]
                peer = work.prev if a.kind == "RECV_F" else work.next
                why = f"waits for a message from {_name(self.programs, peer)}"
            out.append(f"{_name(self.programs, r)} at {a or 'its end'} ({why})")
        return out


def run(programs: Sequence[RankProgram], collectives: Sequence[Collective] = ()) -> Trace:
    """Execute the programs; raises Deadlock if some rank can never finish."""
    _check(programs, collectives)
    st = _Run(programs, collectives)
    while st.heap:
        _, r = heapq.heappop(st.heap)
        st.step_rank(r)
    blocked = st.blocked()
    if blocked:
        raise Deadlock(blocked)
    if st.arrived:
        key = next(iter(st.arrived))
        raise ScheduleError(
            f"{len(st.arrived)} message(s) sent but never received, e.g. "
            f"{_name(programs, key[0])} -> {_name(programs, key[1])} micro-batch {key[4]}"
        )
    return _trace(len(programs), st)


def _trace(n: int, st: _Run) -> Trace:
    iv = np.array(st.intervals, dtype=float).reshape(-1, 6)
    tr = np.array(st.transfers, dtype=float).reshape(-1, 6)
    transfers = (
        Transfers(
            tr[:, 0].astype(int),
            tr[:, 1].astype(int),
            tr[:, 2].astype(bool),
            tr[:, 3].astype(int),
            tr[:, 4],
            tr[:, 5],
        )
        if len(tr)
        else empty_transfers()
    )
    return Trace(
        n, iv[:, 0].astype(int), iv[:, 1].astype(np.int8), iv[:, 2].astype(int), iv[:, 3], iv[:, 4],
        transfers, iv[:, 5].astype(int),
    )  # fmt: skip
