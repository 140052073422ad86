"""`hetpp check`: validate cluster, model, plan and profile files and summarise them."""

from __future__ import annotations

import argparse

from rich.console import Console

from hetpp.cli._options import add_profile_argument
from hetpp.profile.table import load_profiles
from hetpp.report.inputs import cluster_table, model_lines
from hetpp.specs.cluster import load_cluster
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
    p.add_argument(
        "--model", help="preset name, Hugging Face model folder or config.json, or ModelConfig file"
    )
    p.add_argument(
        "--seq-len",
        type=positive_int,
        help="sequence length (default: 2048, or the model's maximum)",
    )
    p.add_argument("--plan", help="plan JSON file; checked against --cluster when given")
    add_profile_argument(p)
    p.set_defaults(func=run)


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
