"""What hetpp read from its input files: the cluster's node groups and the model's shape."""

from __future__ import annotations

from collections.abc import Mapping

from rich import box
from rich.table import Table

from hetpp.specs.cluster import Cluster
from hetpp.specs.model import ModelSpec


def cluster_table(
    cluster: Cluster, slowdown: Mapping[str, float] | None = None, title: str = "Cluster"
) -> Table:
    """One row per node group: GPU type, nodes, device ids, speed, memory, node fabric; with
    `slowdown` (by GPU type name), how much slower than one CPU core each type is emulated."""
    t = Table(
        title=f"{title} {cluster.name!r}: {cluster.num_devices} GPUs",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    cols = ["group", "GPU", "nodes x GPUs", "device ids", "TFLOP/s", "memory GB", "intra GB/s"]
    for col in cols + (["slower than 1 CPU core"] if slowdown else []):
        t.add_column(col, justify="left" if col == "GPU" else "right")
    first = 0
    for i, g in enumerate(cluster.nodes):
        gpu = cluster.type_table[g.gpu.lower()]
        n = g.count * g.gpus_per_node
        t.add_row(
            str(i),
            gpu.name,
            f"{g.count} x {g.gpus_per_node}",
            f"{first}..{first + n - 1}",
            f"{gpu.bf16_tflops:g}",
            f"{gpu.memory_gb:g}",
            f"{g.intra_node_GBps:g}",
            *([f"{slowdown[gpu.name]:g}x"] if slowdown else []),
        )
        first += n
    t.caption = f"inter-node {cluster.inter_node_GBps:g} GB/s, {cluster.inter_node_latency_us:g} us"
    return t


def model_lines(model: ModelSpec) -> list[str]:
    c = model.config
    return [
        f"model {c.name}: {c.family}, {_count(model.total_params)} parameters, "
        f"{c.num_layers} blocks (layer list of {model.layer_list_len}: embedding, blocks, head)",
        f"hidden {c.hidden_size}, heads {c.num_heads} (kv {c.kv_heads}), ffn {c.ffn_hidden_size}, "
        f"vocab {c.vocab_size}, seq {model.seq_len}, tied embeddings: {c.tie_embeddings}",
    ]


def _count(n: int) -> str:
    return f"{n / 1e9:.3f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"
