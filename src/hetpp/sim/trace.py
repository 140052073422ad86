"""What a simulation run recorded: compute and collective intervals per rank, and p2p transfers."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class Kind(IntEnum):
    """What a rank does during an interval: the codes of `Trace.kind`."""

    F = 0
    """Forward of a micro-batch."""
    B = 1
    """Backward of a micro-batch."""
    SYNC = 2
    """Inside a gradient all-reduce."""
    OPT = 3
    """Optimizer step."""
    I = 4  # noqa: E741 (torch's name for the action)
    """Input-grad part of a split backward (sends the gradient upstream)."""
    W = 5
    """Weight-grad part of a split backward (completes the stage's parameter gradients)."""
    GATHER = 6
    """Inside an all-gather of updated parameters (optimizer sharding, after OPT)."""


BACKWARD = (Kind.B, Kind.I, Kind.W)
"""Kinds that make up backward work: a full backward, or its two parts."""
COMPUTE = (Kind.F, *BACKWARD)
"""Kinds of pipeline compute (forward and backward work)."""


@dataclass(frozen=True)
class Transfers:
    """Point-to-point messages, one entry each (arrays of equal length)."""

    src: np.ndarray
    """Sending rank (program index)."""
    dst: np.ndarray
    """Receiving rank."""
    grad: np.ndarray
    """False for a forward activation, True for a backward gradient."""
    microbatch: np.ndarray
    start: np.ndarray
    """When the bytes start moving (the send was issued and the link was free)."""
    end: np.ndarray
    """When the data has arrived at the receiver."""


@dataclass(frozen=True)
class Trace:
    """Intervals during which a rank computed (F, B, OPT) or took part in an all-reduce (SYNC).

    Arrays of equal length, in the order the engine produced them (per rank, compute in time
    order; a collective when it ran, which may be after later compute of the rank: gradient
    all-reduces overlap compute)."""

    num_ranks: int
    rank: np.ndarray
    """Program index of the rank."""
    kind: np.ndarray
    """A Kind code."""
    index: np.ndarray
    """Micro-batch for F/B/I/W, bucket for SYNC, -1 for OPT."""
    start: np.ndarray
    end: np.ndarray
    transfers: Transfers
    stage: np.ndarray
    """Pipeline stage of a compute interval (a rank may run several), -1 for SYNC and OPT."""

    @property
    def makespan_s(self) -> float:
        """End of the last interval (the iteration when it ends with optimizer steps)."""
        ends = [self.end.max(initial=0.0), self.transfers.end.max(initial=0.0)]
        return float(max(ends))

    def time_per_rank(self, kinds: tuple[int, ...]) -> np.ndarray:
        """Seconds each rank spent in intervals of the given kind codes."""
        sel = np.isin(self.kind, kinds)
        dur = self.end[sel] - self.start[sel]
        return np.bincount(self.rank[sel], weights=dur, minlength=self.num_ranks)

    def last_end_per_rank(self, kinds: tuple[int, ...]) -> np.ndarray:
        """End of each rank's last interval of the given kinds (0 where it has none)."""
        sel = np.isin(self.kind, kinds)
        out = np.zeros(self.num_ranks)
        np.maximum.at(out, self.rank[sel], self.end[sel])
        return out

    def first_start_per_rank(self, kinds: tuple[int, ...]) -> np.ndarray:
        """Start of each rank's first interval of the given kinds (inf where it has none)."""
        sel = np.isin(self.kind, kinds)
        out = np.full(self.num_ranks, np.inf)
        np.minimum.at(out, self.rank[sel], self.start[sel])
        return out

    def activation_peak(
        self, saved: np.ndarray, transient: np.ndarray, pending: np.ndarray | None = None
    ) -> np.ndarray:
        """Peak activation bytes of each rank, replaying its compute intervals in time order.

        A micro-batch's saved bytes (`saved[rank]`, or `saved[rank, stage]` when a rank runs
        several stages) are taken when its forward starts and released when its backward ends,
        or, when the backward is split, when its W ends (the weight gradient needs the layer
        inputs); `pending` bytes (shaped as `saved`; None: none) from its I's end to its W's end
        (the weighted ops' output gradients torch keeps for the W); `transient[rank]` more are
        held while a B or I runs (the recomputed activations). With `saved = 1, transient = 0`
        this counts micro-batches in flight."""
        sel = np.isin(self.kind, COMPUTE)
        rank, kind, stage = self.rank[sel], self.kind[sel], self.stage[sel]
        start, end = self.start[sel], self.end[sel]
        saved = np.asarray(saved, float)
        s = saved[rank] if saved.ndim == 1 else saved[rank, stage]
        x = np.asarray(transient, float)[rank]
        p = np.zeros_like(saved) if pending is None else np.asarray(pending, float)
        g = p[rank] if p.ndim == 1 else p[rank, stage]
        zero = np.zeros(len(rank))
        is_f, is_b, is_i, is_w = (kind == k for k in (Kind.F, Kind.B, Kind.I, Kind.W))
        grad = is_b | is_i  # runs the (recomputed) forward again: holds the transient
        # Events: F +saved at its start; B/I +transient at start, -transient at end; I +pending
        # at its end; B and W -saved at their end, W -pending.
        ranks = np.concatenate([rank, rank, rank])
        times = np.concatenate([start, start, end])
        delta = np.concatenate(
            [np.where(is_f, s, zero), np.where(grad, x, zero),
             -np.where(grad, x, zero) - np.where(is_b | is_w, s, zero)
             + np.where(is_i, g, zero) - np.where(is_w, g, zero)]
        )  # fmt: skip
        # Ties release first: a forward starting the instant a backward ends reuses its memory.
        order = np.lexsort((delta, times, ranks))
        ranks, delta = ranks[order], delta[order]
        held = np.cumsum(delta)
        first = np.r_[True, ranks[1:] != ranks[:-1]] if len(ranks) else np.zeros(0, bool)
        seg = np.maximum.accumulate(np.where(first, np.arange(len(held)), 0))
        held = held - (held[seg] - delta[seg])  # restart the running sum for each rank
        out = np.zeros(self.num_ranks)
        np.maximum.at(out, ranks, held)
        return out

    def max_in_flight(self) -> np.ndarray:
        """Most micro-batches whose activations each rank held at once."""
        ones = np.ones(self.num_ranks)
        return np.rint(self.activation_peak(ones, 0 * ones)).astype(int)


def empty_transfers() -> Transfers:
    """No messages (a plan of one-stage pipelines)."""
    z = np.zeros(0)
    return Transfers(z.astype(int), z.astype(int), z.astype(bool), z.astype(int), z, z)
