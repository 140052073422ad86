"""An emulated heterogeneous cluster on this CPU: the built-in cluster, and the profile that makes
predictions comparable with what `hetpp train --emulate` measures.

Under emulation every rank is a CPU process with one thread, and a device of type T stretches each
forward/backward to `emulate_slowdown(T)` times its CPU time. So the profile of T is this CPU's
single-thread profile of the model, times T's factor, measured here and now (nothing cached), with
cold caches (`hetpp.runtime.profiler`: between its calls a rank sleeps while others run).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

from hetpp.profile.table import ProfileRow, ProfileTable
from hetpp.specs.cluster import Cluster, emulate_slowdown, load_cluster
from hetpp.specs.model import ModelConfig

DEMO_CLUSTER = "demo-cluster.yaml"
"""The built-in emulated cluster, in `hetpp.data`."""
CPU = "CPU"
"""GPU-type name of the measured CPU rows."""


def builtin_cluster() -> Cluster:
    """The cluster `hetpp demo` runs on (`src/hetpp/data/demo-cluster.yaml`)."""
    with resources.as_file(resources.files("hetpp.data").joinpath(DEMO_CLUSTER)) as path:
        return load_cluster(path)


def type_factors(cluster: Cluster) -> dict[str, float]:
    """Emulation factor of each GPU type the cluster's devices use, by type name."""
    out: dict[str, float] = {}
    for d in cluster.devices:
        out.setdefault(d.gpu.name, emulate_slowdown(cluster, d.id))
    return out


def profile_cpu(
    model: ModelConfig,
    seq_len: int,
    micro_batch_sizes: list[int],
    repeats: int = 5,
    on_row: Callable[[ProfileRow], None] | None = None,
) -> ProfileTable:
    """This CPU's profile of `model` with one intra-op thread, as each emulated rank runs it."""
    import torch

    from hetpp.runtime.profiler import profile_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = profile_model(
            model,
            CPU,
            micro_batch_sizes,
            seq_len,
            torch.device("cpu"),
            torch.float32,
            repeats=repeats,
            on_row=on_row,
            cold=True,  # between its calls an emulated rank sleeps and others evict its caches
        )
    finally:
        torch.set_num_threads(threads)
    return ProfileTable(rows)


def emulated_profiles(cpu: ProfileTable, cluster: Cluster) -> ProfileTable:
    """The CPU rows once per GPU type of `cluster`, times scaled by the type's emulation factor."""
    rows: list[ProfileRow] = []
    for gpu, factor in type_factors(cluster).items():
        rows += cpu.for_gpu(CPU).scaled(gpu, factor).rows
    return ProfileTable(rows)
