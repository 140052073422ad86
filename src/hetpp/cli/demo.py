"""`hetpp demo`: plan, simulate and train on a built-in emulated heterogeneous cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hetpp.specs.errors import SpecError
from hetpp.specs.io import check_output_dir
from hetpp.specs.values import positive_int

EXAMPLES = """examples:
  hetpp demo                      # about two minutes on a 2-core laptop; writes hetpp-demo/
  hetpp demo --out /tmp/demo --steps 10 --train-all
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="plan, simulate and train hpp and a baseline on an emulated mixed cluster",
        description="On a built-in cluster of fast and slow GPU types emulated by CPU processes: "
        "profile the demo model on this CPU, plan it with hpp and the usual strategies, simulate "
        "each plan, train hpp and the best baseline with the real runtime, and print predicted "
        "against measured step times. Writes Gantt charts and a predicted-vs-measured chart.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("hetpp-demo"), help="output folder")
    p.add_argument(
        "--steps", type=positive_int, default=7, help="training steps per plan (default 7)"
    )
    p.add_argument("--train-all", action="store_true", help="train every feasible baseline too")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetpp.demo.compare import WARMUP_STEPS
    from hetpp.demo.runs import TrainFailed
    from hetpp.demo.tour import DemoOptions, run_demo

    if args.steps <= WARMUP_STEPS:
        raise SpecError(f"must be more than {WARMUP_STEPS} (warm-up steps)", field="--steps")
    check_output_dir(args.out, "--out")
    opts = DemoOptions(out=args.out, steps=args.steps, train_all=args.train_all)
    try:
        return run_demo(opts, Console())
    except TrainFailed as e:  # the message names the run's log and ends with its last lines
        print(f"hetpp demo: {e}", file=sys.stderr)
        return 1
