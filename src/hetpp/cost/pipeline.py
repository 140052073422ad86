"""Closed-form pipeline time for one step of a pipeline with heterogeneous stages."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from hetpp.cost.comm import p2p_time_s
from hetpp.cost.compute import LayerCosts
from hetpp.specs.cluster import Link
from hetpp.specs.schedule import SCHEDULES

Times = Sequence[float]


def _traversal_fill(fwd_s: Times, bwd_s: Times, comm_s: Times) -> float:
    """One micro-batch through every stage and link, forward and back."""
    return sum(fwd_s) + sum(bwd_s) + 2 * sum(comm_s)


def _lockstep_beat(fwd_s: Times, bwd_s: Times, comm_s: Times) -> float:
    """1F1B runs stages in lock-step: in steady state stage s alternates F(r + S-s-1) and B(r),
    so stages s..t form a cycle (F travels s -> t, B comes back, then s may start its next
    forward) that holds t-s+1 micro-batches. Each such window of consecutive stages bounds the
    beat by its mean, `(sum of f+b over the window + 2 x the transfers inside it) / (t - s + 1)`;
    the beat is the largest mean (the max cycle mean of the schedule's event graph). Without
    transfers that is the slowest stage's f+b; a slow link between stages adds about its
    transfer time per micro-batch, which the event simulator shows and the slowest stage alone
    misses."""
    c = list(comm_s)
    work = [f + b for f, b in zip(fwd_s, bwd_s)]
    best = max(work)
    if not any(c):  # a window's mean never exceeds its slowest stage
        return float(best)
    if len(work) >= NUMPY_WINDOWS:
        return _lockstep_beat_numpy(np.array(work), np.array(c))
    # O(S^2) over windows; plain Python beats numpy's call overhead at small depths
    for s in range(len(work) - 1):
        total = work[s]
        for t in range(s + 1, len(work)):
            total += work[t] + 2 * c[t - 1]
            best = max(best, total / (t - s + 1))
    return float(best)


NUMPY_WINDOWS = 20
"""Pipeline depth from which `_lockstep_beat` runs its windows as one numpy cumulative sum."""


def _lockstep_beat_numpy(work: np.ndarray, comm: np.ndarray) -> float:
    """`_lockstep_beat`'s windows as an S x S array: row s holds stage s's work, then each later
    stage's work plus its two transfers, summed left to right (`cumsum` accumulates in order,
    so every window total rounds as the loop's does)."""
    n = len(work)
    step = np.concatenate([[0.0], work[1:] + 2 * comm])
    totals = np.cumsum(np.triu(np.broadcast_to(step, (n, n)), 1) + np.diag(work), axis=1)
    span = np.arange(n)[None, :] - np.arange(n)[:, None] + 1
    return float(np.where(span > 0, totals / np.maximum(span, 1), -np.inf).max())


def _flow_lines_beat(fwd_s: Times, bwd_s: Times, comm_s: Times) -> float:
    """GPipe's two phases are flow lines in which each link is a stage of its own: forward
    paced by max(f, c), backward by max(b, c)."""
    c = list(comm_s)
    return float(max([*fwd_s, *c]) + max([*bwd_s, *c]))


class TimingRule(NamedTuple):
    """How a schedule's pipeline time `fill + (m - 1) * beat` is made."""

    fill: Callable[[Times, Times, Times], float]
    """Seconds of the first micro-batch through all stages and back (fill and drain)."""
    beat: Callable[[Times, Times, Times], float]
    """Steady-state seconds each further micro-batch adds."""


TIMING_RULES: dict[str, TimingRule] = {
    "lockstep": TimingRule(_traversal_fill, _lockstep_beat),
    "flow-lines": TimingRule(_traversal_fill, _flow_lines_beat),
}
"""Timing rules by the name a `hetpp.specs.schedule.ScheduleSpec` gives."""


def timing_rule(schedule: str) -> TimingRule:
    """The timing rule of a schedule in the registry."""
    return TIMING_RULES[SCHEDULES[schedule].timing_rule]


def beat_s(fwd_s: Times, bwd_s: Times, comm_s: Times, schedule: str = "1f1b") -> float:
    """Steady-state seconds per micro-batch: what each micro-batch beyond the first adds."""
    return timing_rule(schedule).beat(fwd_s, bwd_s, comm_s)


def pipeline_time_s(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    comm_s: Sequence[float],
    num_micro_batches: int,
    schedule: str = "1f1b",
) -> float:
    """Time from the first forward to the last backward of one step: `fill + (m - 1) * beat`.

    `comm_s[s]` is the one-way activation (and gradient) transfer time between stage s and s+1
    (length S-1). The fill and drain traverse every stage once in each direction; `beat_s` paces
    the other m-1 micro-batches. Exact for GPipe. For 1F1B exact with free links when the last
    stage is the slowest; when an earlier stage paces, its warm-up forwards overlap the round
    trip behind it, which the fill still charges, so the form is pessimistic there (the simulator
    finds it within 5% on the plans of docs/benchmarks-sim.md)."""
    fill, beat = fill_and_beat(fwd_s, bwd_s, comm_s, schedule)
    return float(steady_time_s(fill, beat, num_micro_batches))


def steady_time_s(fill_s, beat_s, num_micro_batches):
    """`fill + (m - 1) * beat`, elementwise over numpy arrays (the planner's data balance)."""
    return fill_s + (num_micro_batches - 1) * beat_s


def micro_batches_within(time_s, fill_s, beat_s):
    """Most micro-batches m with `steady_time_s(fill, beat, m) <= time_s` (elementwise), with a
    hair of slack so that a time computed as `fill + (m - 1) * beat` counts as reaching m."""
    return np.floor((time_s - fill_s) / beat_s + 1e-9) + 1


def fill_and_beat(
    fwd_s: Sequence[float], bwd_s: Sequence[float], comm_s: Sequence[float], schedule: str = "1f1b"
) -> tuple[float, float]:
    """(fill, beat) of `pipeline_time_s = fill + (m - 1) * beat` (the planner costs a pipeline
    shape once with these and any m afterwards)."""
    rule = timing_rule(schedule)
    return rule.fill(fwd_s, bwd_s, comm_s), rule.beat(fwd_s, bwd_s, comm_s)


def stage_times(
    costs: Sequence[LayerCosts], bounds: Sequence[int], links: Sequence[Link]
) -> tuple[list[float], list[float], list[float]]:
    """Per-micro-batch (forward, backward, one-way transfer to the next stage) of a pipeline
    whose stage s holds layers `[bounds[s], bounds[s+1])` with layer costs `costs[s]`, its
    transfers crossing `links` (length S-1)."""
    spans = list(itertools.pairwise(bounds))
    fwd = [c.fwd(a, b) for c, (a, b) in zip(costs, spans)]
    bwd = [c.bwd(a, b) for c, (a, b) in zip(costs, spans)]
    comm = [p2p_time_s(c.send_bytes[b - 1], link) for c, (_, b), link in zip(costs, spans, links)]
    return fwd, bwd, comm


def backward_done_s(bwd_s: Sequence[float], comm_s: Sequence[float], total_s: float) -> list[float]:
    """When each stage finishes its last backward: stage 0 at the end, stage s earlier by the
    backward and transfer times of the stages in front of it."""
    done, t = [], total_s
    for s in range(len(bwd_s)):
        done.append(t)
        if s < len(comm_s):
            t -= bwd_s[s] + comm_s[s]
    return done
