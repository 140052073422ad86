"""`hetpp train`: run a plan on this machine, one process per device in the plan."""

from __future__ import annotations

import argparse
import importlib.util

from hetpp.runtime.options import add_arguments, from_args
from hetpp.specs.errors import SpecError

EXAMPLES = """examples:
  hetpp train --plan plan.json --steps 20 --metrics run.jsonl
  hetpp train --plan plan.json --emulate --verify            # CPU box posing as the plan's cluster
  hetpp train --plan plan.json --checkpoint-dir ckpt --resume --steps 100
  hetpp train --plan plan.json --init-from hf-model/ --checkpoint-dir ckpt   # fine-tune HF weights

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
    from hetpp.dataset.shards import data_kind
    from hetpp.runtime.launch import launch
    from hetpp.specs.plan import load_plan
    from hetpp.specs.presets import check_folder_model

    opts = from_args(args)
    plan = load_plan(opts.plan)
    # Checked here so a bad input gives one message, not one per rank.
    if opts.emulate and plan.cluster is None:
        raise SpecError("--emulate needs the plan's cluster (the `cluster` key)", file=opts.plan)
    if opts.data is not None:
        data_kind(opts.data)  # a format it cannot read is one line and exit 2
    if opts.init_from is not None:
        check_folder_model(plan.model, opts.init_from)
    if opts.tensorboard is not None and importlib.util.find_spec("tensorboard") is None:
        raise SpecError(
            "needs the tensorboard package: pip install 'hetpp[tensorboard]'", field="--tensorboard"
        )
    return launch(opts, plan.num_devices)
