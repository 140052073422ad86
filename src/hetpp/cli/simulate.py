"""`hetpp simulate PLAN.json`: replay one training step event by event; optional Gantt chart."""

from __future__ import annotations

import argparse
import json
import sys

from hetpp.cli._options import add_profile_argument
from hetpp.cost.step import cost_model_for_plan, step_cost
from hetpp.profile.table import load_profiles
from hetpp.specs.errors import SpecError
from hetpp.specs.io import check_output_file
from hetpp.specs.plan import load_plan

EXAMPLES = """examples:
  hetpp simulate plan.json
  hetpp simulate plan.json --gantt step.png
  hetpp simulate plan.json --profile a100.csv v100.csv --json
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate one step of a plan; per-device utilisation, memory, Gantt chart",
        description="Discrete-event replay of a plan's pipelines (every schedule of the "
        "registry: 1F1B, GPipe, interleaved, zero-bubble, V), transfers, "
        "block-wise gradient all-reduces and optimizer steps on the cost model: iteration time, "
        "per-pipeline time, per-device busy/idle share, bubble share, exposed gradient sync, and "
        "peak memory per device against its capacity.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("plan", help="plan JSON file (from `hetpp plan`)")
    add_profile_argument(p)
    p.add_argument("--gantt", metavar="PNG", help="write a Gantt chart of the step")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetpp.sim import ScheduleError, simulate_plan

    if args.gantt:
        check_output_file(args.gantt, "--gantt")
    plan = load_plan(args.plan)
    cm = cost_model_for_plan(plan, load_profiles(args.profile))
    err = Console(stderr=True)
    try:
        with err.status(f"simulating {plan.num_devices} devices", spinner="dots"):
            result = simulate_plan(plan, cm)
    except SpecError as e:  # the plan is too large to simulate
        raise e.in_file(args.plan) from None
    except ScheduleError as e:  # a bug in the schedule builder, not in the user's plan
        print(f"hetpp simulate: {e}", file=sys.stderr)
        return 1
    closed = step_cost(plan, cm).iteration_time_s
    if args.gantt:
        from hetpp.report.charts import gantt_chart

        with err.status("drawing the Gantt chart", spinner="dots"):
            gantt_chart(result, args.gantt, title=f"{plan.model.name}, {plan.strategy} plan")
    if args.json:
        out = {**result.to_dict(), "closed_form_iteration_time_s": closed}
        if args.gantt:
            out["gantt"] = args.gantt
        print(json.dumps(out, indent=1))
        return 0
    from hetpp.report.sim_tables import print_simulation

    print_simulation(result, closed)
    if args.gantt:
        print(f"Gantt chart: {args.gantt}")
    return 0
