"""Communication times: point-to-point activations and ring all-reduce."""

from __future__ import annotations

from hetpp.specs.cluster import Link


def p2p_time_s(num_bytes: float, link: Link) -> float:
    """One message over one link."""
    return float(num_bytes) / link.bw_bytes_per_s + link.latency_s


def allreduce_time_s(num_bytes: float, num_ranks: int, link: Link) -> float:
    """Ring all-reduce of `num_bytes` over `num_ranks` ranks whose slowest link is `link`.

    Reduce-scatter plus all-gather: each rank sends and receives 2(P-1)/P of the data in
    2(P-1) steps, each paying the link latency."""
    if num_ranks <= 1:
        return 0.0
    p = num_ranks
    return 2 * (p - 1) / p * num_bytes / link.bw_bytes_per_s + 2 * (p - 1) * link.latency_s
