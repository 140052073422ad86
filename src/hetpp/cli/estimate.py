"""`hetpp estimate PLAN.json`: the cost model's breakdown of a plan."""

from __future__ import annotations

import argparse
import json

from hetpp.cli._options import add_profile_argument
from hetpp.cost.step import cost_model_for_plan, step_cost
from hetpp.profile.table import load_profiles
from hetpp.report.tables import print_step, step_dict
from hetpp.specs.plan import load_plan

EXAMPLES = """examples:
  hetpp estimate plan.json
  hetpp estimate plan.json --profile a100.csv --json
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="predict step time and memory of a plan",
        description="Per pipeline, stage and device: compute, transfers, memory against capacity, "
        "block-wise gradient sync, iteration time and throughput, from the cost model.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("plan", help="plan JSON file (from `hetpp plan`)")
    add_profile_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    cm = cost_model_for_plan(plan, load_profiles(args.profile))
    step = step_cost(plan, cm)
    if args.json:
        print(json.dumps(step_dict(step), indent=1))
    else:
        print_step(step, [(p.micro_batch_size, p.num_micro_batches) for p in plan.pipelines])
    return 0
