"""Cluster spec: node groups of one GPU type each, links, and stable device ids."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    model_validator,
)

from hetpp.specs.catalog import CATALOG, GpuType, catalog_names
from hetpp.specs.io import load_model_file
from hetpp.specs.limits import MAX_DEVICES, check_size


class NodeGroup(BaseModel):
    """`count` identical nodes, each with `gpus_per_node` GPUs of one type."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    gpu: str
    """GPU type name: a catalog entry or one defined under `gpu_types`."""
    gpus_per_node: int = Field(gt=0, strict=True)
    """GPUs in each node of this group (an integer: `true` or `2.0` are refused, not rounded)."""
    count: int = Field(1, gt=0, strict=True)
    """Number of identical nodes in this group."""
    intra_node_GBps: float = Field(gt=0, le=100_000)
    """GPU-to-GPU bandwidth inside one node (NVLink, PCIe), GB/s per direction (bytes, not bits)."""


class Device(NamedTuple):
    """One GPU of the cluster; ids run 0..N-1 in file order (group, node, GPU)."""

    id: int
    gpu: GpuType
    node: int
    """Global node index (file order)."""
    group: int
    """Index of the node group in the cluster file."""


class Link(NamedTuple):
    bw_bytes_per_s: float
    latency_s: float


class Cluster(BaseModel):
    """A heterogeneous cluster as read from a YAML file."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = "cluster"
    """Free-form name shown in reports."""
    gpu_types: tuple[GpuType, ...] = ()
    """New GPU types, or overrides of catalog entries with the same name."""
    nodes: tuple[NodeGroup, ...] = Field(min_length=1)
    """Node groups, in order; device ids follow this order."""
    inter_node_GBps: float = Field(gt=0, le=100_000)
    """Bandwidth between any two nodes, GB/s per direction."""
    inter_node_latency_us: NonNegativeFloat = 10.0
    """Latency of one inter-node message, microseconds."""
    intra_node_latency_us: NonNegativeFloat = 5.0
    """Latency of one intra-node message, microseconds."""

    @model_validator(mode="after")
    def _known_types(self) -> Cluster:
        total = sum(g.gpus_per_node * g.count for g in self.nodes)  # before `devices` is built
        check_size("number of GPUs", total, MAX_DEVICES, field="nodes")
        known = self.type_table
        for i, g in enumerate(self.nodes):
            if g.gpu.lower() not in known:
                raise ValueError(
                    f"nodes[{i}].gpu: unknown GPU type {g.gpu!r}; expected one of "
                    f"{', '.join(sorted(catalog_names()))} or a name under gpu_types"
                )
        return self

    @cached_property
    def type_table(self) -> dict[str, GpuType]:
        """Catalog merged with this file's `gpu_types` (file entries win), keyed by lower name."""
        return {**CATALOG, **{t.name.lower(): t for t in self.gpu_types}}

    @cached_property
    def devices(self) -> tuple[Device, ...]:
        out, node = [], 0
        for gi, g in enumerate(self.nodes):
            gpu = self.type_table[g.gpu.lower()]
            for _ in range(g.count):
                out += [Device(len(out) + k, gpu, node, gi) for k in range(g.gpus_per_node)]
                node += 1
        return tuple(out)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def gpu(self, device: int) -> GpuType:
        return self.devices[device].gpu


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster YAML file; raises SpecError naming the file and field."""
    return load_model_file(Cluster, path)


def emulate_slowdown(cluster: Cluster, device: int) -> float:
    """CPU emulation factor of a device: its type's `emulate_slowdown`, else fastest / its peak."""
    gpu = cluster.gpu(device)
    if gpu.emulate_slowdown is not None:
        return gpu.emulate_slowdown
    return max(d.gpu.peak_flops_per_s for d in cluster.devices) / gpu.peak_flops_per_s
