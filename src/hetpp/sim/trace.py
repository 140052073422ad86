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
    GATHER = 4
    """Inside an all-gather of updated parameters (optimizer sharding, after OPT)."""


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

    Arrays of equal length, in the order the engine produced them (per rank, time order)."""

    num_ranks: int
    rank: np.ndarray
    """Program index of the rank."""
    kind: np.ndarray
    """A Kind code."""
    index: np.ndarray
    """Micro-batch for F/B, bucket for SYNC, -1 for OPT."""
    start: np.ndarray
    end: np.ndarray
    transfers: Transfers

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

    def activation_peak(self, saved: np.ndarray, transient: np.ndarray) -> np.ndarray:
        """Peak activation bytes of each rank, replaying its F and B intervals in time order.

        A micro-batch's `saved[rank]` bytes are taken when its forward starts and released when its
        backward ends; `transient[rank]` more are held while a backward runs (the recomputed
        activations). With `saved = 1, transient = 0` this counts micro-batches in flight."""
        sel = np.isin(self.kind, (Kind.F, Kind.B))
        rank, kind = self.rank[sel], self.kind[sel]
        is_f = kind == Kind.F
        s, x = np.asarray(saved, float)[rank], np.asarray(transient, float)[rank]
        # Each F is one event (+saved at its start); each B two (+transient at its start,
        # -(saved + transient) at its end).
        rank_b = rank[~is_f]
        ranks = np.concatenate([rank[is_f], rank_b, rank_b])
        times = np.concatenate(
            [self.start[sel][is_f], self.start[sel][~is_f], self.end[sel][~is_f]]
        )
        delta = np.concatenate([s[is_f], x[~is_f], -(s + x)[~is_f]])
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
