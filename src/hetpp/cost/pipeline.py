"""Closed-form pipeline time for one step of a pipeline with heterogeneous stages."""

from __future__ import annotations

from collections.abc import Sequence


def pipeline_time_s(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    comm_s: Sequence[float],
    num_micro_batches: int,
    schedule: str = "1f1b",
) -> float:
    """Time from the first forward to the last backward of one step.

    `comm_s[s]` is the one-way activation (and gradient) transfer time between stage s and s+1
    (length S-1). 1F1B: the fill and drain traverse every stage once in each direction, and the
    slowest stage paces the other m-1 micro-batches. GPipe runs all forwards, then all backwards,
    each phase paced by its own slowest stage.
    """
    m = num_micro_batches
    fill = sum(fwd_s) + sum(bwd_s) + 2 * sum(comm_s)
    if schedule == "gpipe":
        return float(fill + (m - 1) * (max(fwd_s) + max(bwd_s)))
    return float(fill + (m - 1) * max(f + b for f, b in zip(fwd_s, bwd_s)))


def backward_done_s(bwd_s: Sequence[float], comm_s: Sequence[float], total_s: float) -> list[float]:
    """When each stage finishes its last backward: stage 0 at the end, stage s earlier by the
    backward and transfer times of the stages in front of it."""
    done, t = [], total_s
    for s in range(len(bwd_s)):
        done.append(t)
        if s < len(comm_s):
            t -= bwd_s[s] + comm_s[s]
    return done
