"""`hetpp check`: validate cluster, model, plan and profile files and summarise them."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from hetpp.cli._options import add_profile_argument
from hetpp.profile.table import load_profiles
from hetpp.specs.cluster import Cluster, load_cluster
from hetpp.specs.model import ModelSpec
from hetpp.specs.plan import load_plan
from hetpp.specs.presets import load_model, load_model_config
from hetpp.specs.values import positive_int

EXAMPLES = """examples:
  hetpp check --cluster examples/a100-v100.yaml
  hetpp check --model llama2-7b --seq-len 4096
  hetpp check --model path/to/config.json
  hetpp check --plan plan.json --cluster examples/a100-v100.yaml
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="validate input files and summarise them",
        description="Validate cluster, model, plan and profile files; print what hetpp read.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cluster", help="cluster YAML file")
    p.add_argument("--model", help="preset name, Hugging Face config.json, or ModelConfig file")
    p.add_argument(
        "--seq-len",
        type=positive_int,
        help="sequence length (default: 2048, or the model's maximum)",
    )
    p.add_argument("--plan", help="plan JSON file; checked against --cluster when given")
    add_profile_argument(p)
    p.set_defaults(func=run)


def cluster_table(cluster: Cluster) -> Table:
    t = Table(title=f"Cluster {cluster.name!r}: {cluster.num_devices} GPUs", title_justify="left")
    for col in ("group", "GPU", "nodes x GPUs", "device ids", "TFLOP/s", "memory GB", "intra GB/s"):
        t.add_column(col)
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
        )
        first += n
    t.caption = f"inter-node {cluster.inter_node_GBps:g} GB/s, {cluster.inter_node_latency_us:g} us"
    return t


def model_lines(model: ModelSpec) -> list[str]:
    c = model.config
    return [
        f"model {c.name}: {c.family}, {_count(model.total_params)} parameters, "
        f"{c.num_layers} blocks (layer list of {model.num_layers}: embedding, blocks, head)",
        f"hidden {c.hidden_size}, heads {c.num_heads} (kv {c.kv_heads}), ffn {c.ffn_hidden_size}, "
        f"vocab {c.vocab_size}, seq {model.seq_len}, tied embeddings: {c.tie_embeddings}",
    ]


def _count(n: int) -> str:
    return f"{n / 1e9:.3f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def run(args: argparse.Namespace) -> int:
    console = Console()
    if not (args.cluster or args.model or args.plan or args.profile):
        console.print("nothing to check: give --cluster, --model, --plan or --profile")
        return 2
    cluster = load_cluster(args.cluster) if args.cluster else None
    if cluster:
        console.print(cluster_table(cluster))
    if args.model:
        seq_len = args.seq_len or min(2048, load_model_config(args.model).max_seq_len)
        for line in model_lines(load_model(args.model, seq_len)):
            console.print(line)
    if args.plan:
        plan = load_plan(args.plan, cluster)
        console.print(
            f"plan {args.plan}: valid; {len(plan.pipelines)} pipelines over "
            f"{plan.num_devices} devices, {len(plan.blocks())} gradient blocks"
        )
    if args.profile:
        table = load_profiles(args.profile)
        console.print(f"profiles: {len(table.rows)} rows for GPU types {sorted(table.gpus())}")
    return 0
