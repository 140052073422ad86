"""`hetpp train`: run a plan on this machine, one process per device in the plan."""

from __future__ import annotations

import argparse
import sys

from hetpp.runtime.options import add_arguments, from_args

EXAMPLES = """examples:
  hetpp train --plan plan.json --steps 20 --metrics run.jsonl
  hetpp train --plan plan.json --emulate --verify            # CPU box posing as the plan's cluster
  hetpp train --plan plan.json --checkpoint-dir ckpt --resume --steps 100

several nodes: run on each node (same plan file; rank r plays the plan's r-th device by id)
  torchrun --nnodes 2 --node-rank K --nproc-per-node 4 --master-addr HOST --master-port 29500 \\
      -m hetpp.train --plan plan.json --steps 20
  (node K in cluster-file order: a static rank order keeps rank r on the plan's device r)
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a plan: one local process per device (torchrun for several nodes)",
        description="Execute a plan with torch.distributed pipelining on local ranks (gloo on "
        "CPU, NCCL when there is a GPU per rank).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hetpp.runtime.launch import launch
    from hetpp.runtime.preflight import check_run
    from hetpp.specs.plan import load_plan

    opts = from_args(args)
    plan = load_plan(opts.plan)
    # Checked here so a bad input gives one message before any work, not one per rank after it.
    for notice in check_run(opts, plan):
        print(f"hetpp train: {notice}", file=sys.stderr, flush=True)
    return launch(opts, plan.num_devices)
