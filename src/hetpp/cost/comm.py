"""Communication: which link a hop or a ring crosses, and how long messages and all-reduces take.

Every link rule lives here: the planner asks these with what it knows at its level (a template
knows GPU types and whether a hop or ring leaves a node; a plan knows device ids)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from hetpp.specs.cluster import Cluster, Link


def hop_link(cluster: Cluster, same_node: bool, intra_bw_bytes_per_s: float) -> Link:
    """The link one point-to-point hop crosses: the node's own fabric inside a node (of
    bandwidth `intra_bw_bytes_per_s`), else the network."""
    if same_node:
        return Link(intra_bw_bytes_per_s, cluster.intra_node_latency_us * 1e-6)
    return Link(cluster.inter_node_GBps * 1e9, cluster.inter_node_latency_us * 1e-6)


def ring_link(cluster: Cluster, intra_bws_bytes_per_s: Iterable[float], spans_nodes: bool) -> Link:
    """The slowest link a ring uses (bandwidth-bound collectives see this one): a ring spanning
    nodes runs at the slower of the network and its nodes' own fabric (`intra_bws_bytes_per_s`,
    one per node kind it touches); a ring inside one node at that node's fabric."""
    intra = min(intra_bws_bytes_per_s)
    if spans_nodes:
        bw = min(cluster.inter_node_GBps * 1e9, intra)
        return Link(bw, cluster.inter_node_latency_us * 1e-6)
    return Link(intra, cluster.intra_node_latency_us * 1e-6)


def fastest_link(cluster: Cluster) -> Link:
    """A link at least as fast as any the cluster has (for optimistic bounds)."""
    bw = max([g.intra_node_GBps * 1e9 for g in cluster.nodes] + [cluster.inter_node_GBps * 1e9])
    return Link(bw, min(cluster.intra_node_latency_us, cluster.inter_node_latency_us) * 1e-6)


def _intra_bw(cluster: Cluster, device: int) -> float:
    return cluster.nodes[cluster.devices[device].group].intra_node_GBps * 1e9


def tp_link_for_type(cluster: Cluster, gpu_name: str) -> Link:
    """The link a tensor-parallel group of GPU type `gpu_name` all-reduces over, where only the
    type is known: the fastest fabric among that type's nodes (a plan's group asks
    `group_link` of its devices)."""
    bws = [g.intra_node_GBps for g in cluster.nodes if g.gpu.lower() == gpu_name.lower()]
    return Link(max(bws) * 1e9, cluster.intra_node_latency_us * 1e-6)


def p2p_link(cluster: Cluster, a: int, b: int) -> Link:
    """The link between two devices."""
    same = cluster.devices[a].node == cluster.devices[b].node
    return hop_link(cluster, same, _intra_bw(cluster, a))


def group_link(cluster: Cluster, devices: Sequence[int]) -> Link:
    """The slowest link a ring over `devices` uses."""
    spans = len({cluster.devices[d].node for d in devices}) > 1
    return ring_link(cluster, (_intra_bw(cluster, d) for d in devices), spans)


def p2p_time_s(num_bytes: float, link: Link) -> float:
    """One message over one link."""
    return float(num_bytes) / link.bw_bytes_per_s + link.latency_s


def ring_pass_time_s(
    num_bytes: float | np.ndarray, num_ranks: int | np.ndarray, link: Link
) -> float | np.ndarray:
    """One pass of a ring over `num_ranks` ranks whose slowest link is `link`: a reduce-scatter
    of `num_bytes` (each rank ends with its summed 1/P) or an all-gather of `num_bytes` in all
    (each rank contributes 1/P). Each rank sends and receives (P-1)/P of the data in P-1 steps,
    each paying the link latency (elementwise over arrays; 0 for one rank)."""
    p = num_ranks
    return (p - 1) / p * num_bytes / link.bw_bytes_per_s + (p - 1) * link.latency_s


def scalar_allreduce_time_s(num_ranks: int, link: Link) -> float:
    """All-reduce of one scalar (the gradient norm) over `num_ranks` ranks whose slowest link is
    `link`: latency-bound, a reduce up a binary tree and a broadcast down it (what NCCL picks for
    a few bytes), 2 ceil(log2 P) hops (0 for one rank)."""
    return 2 * math.ceil(math.log2(num_ranks)) * link.latency_s


def allreduce_time_s(
    num_bytes: float | np.ndarray, num_ranks: int | np.ndarray, link: Link
) -> float | np.ndarray:
    """Ring all-reduce of `num_bytes` over `num_ranks` ranks whose slowest link is `link`
    (elementwise over arrays; 0 for one rank): a reduce-scatter plus an all-gather,
    2(P-1)/P of the data in 2(P-1) steps."""
    return 2 * ring_pass_time_s(num_bytes, num_ranks, link)
