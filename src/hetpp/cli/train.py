"""`hetpp train`: run a plan on this machine, one process per device in the plan."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from hetpp.runtime.options import add_arguments, from_args
from hetpp.specs.errors import SpecError

EXAMPLES = """examples:
  hetpp train --plan plan.json --steps 20 --metrics run.jsonl
  hetpp train --plan plan.json --emulate --verify            # CPU box posing as the plan's cluster
  hetpp train --plan plan.json --checkpoint-dir ckpt --resume --steps 100
  hetpp train --plan plan.json --init-from hf-model/ --checkpoint-dir ckpt   # fine-tune HF weights
  hetpp train --plan plan.json --steps 3 --memory-report   # predicted vs measured per rank

several nodes: on each node, the command `hetpp plan` printed for it (same plan file)
  torchrun --nnodes 2 --node-rank K --nproc-per-node 4 --master-addr HOST --master-port 29500 \\
      -m hetpp.train --plan plan.json --steps 20
  (node K in cluster-file order, one process per GPU the file gives it: rank r is cluster device
  r; ranks of devices the plan leaves unused exit at once)
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
    if not opts.memory_report:
        return launch(opts, plan.num_devices)
    if plan.cluster is None:
        raise SpecError("--memory-report needs the plan's cluster (the `cluster` key)",
                        file=opts.plan)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        metrics = opts.metrics or str(Path(tmp) / "metrics.jsonl")
        code = launch(dataclasses.replace(opts, metrics=metrics), plan.num_devices)
        if code == 0:
            _memory_report(plan, Path(metrics))
    return code


def _memory_report(plan, metrics: Path) -> None:
    """Prints predicted vs measured per rank and puts the prediction into the memory records."""
    from hetpp.report.memory import memory_rows, print_memory_report
    from hetpp.runtime.metrics import load_records

    steps = [line for line in metrics.read_text().splitlines() if '"kind":' not in line]
    rows = memory_rows(plan, load_records(metrics, "memory"))
    print_memory_report(rows)
    metrics.write_text("".join(line + "\n" for line in steps + [json.dumps(r) for r in rows]))
