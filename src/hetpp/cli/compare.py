"""`hetpp compare`: every planner strategy on one problem, side by side."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from hetpp.cli._options import add_problem_arguments, problem_from, search_progress
from hetpp.planner import STRATEGIES, plan
from hetpp.planner.assemble import PlanResult
from hetpp.planner.feasibility import explain_infeasible
from hetpp.planner.oracle import MAX_DEVICES
from hetpp.report.plans import comparison_table
from hetpp.specs.errors import SpecError
from hetpp.specs.io import check_output_file

EXAMPLES = """examples:
  hetpp compare --cluster cluster.yaml --model gpt3-13b --global-batch 1024
  hetpp compare --cluster cluster.yaml --model llama2-7b --global-batch 512 --json
  hetpp compare --cluster cluster.yaml --model gpt3-6.7b --global-batch 512 --plot compare.png
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="every planner strategy on one cluster and model, side by side",
        description="Plan the same model, batch and cluster with uniform (Megatron-style), "
        "layer-balanced (Metis/AMP-style), data-balanced (Whale/Oobleck-style), hpp and, on "
        f"clusters of at most {MAX_DEVICES} devices, the exhaustive oracle; same cost model, same "
        "plan format.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_problem_arguments(p)
    p.add_argument("--json", action="store_true", help="print a JSON list, one object each")
    p.add_argument("--plot", metavar="PNG", help="bar chart of the throughputs")
    p.set_defaults(func=run)


def compare(args: argparse.Namespace, progress: bool = True) -> list[PlanResult]:
    """Each strategy on a fresh problem (so no strategy profits from another's caches)."""
    results = []
    for name in STRATEGIES:
        problem = problem_from(args)
        if name == "oracle" and problem.cluster.num_devices > MAX_DEVICES:
            results.append(PlanResult(name, None, None, 0.0, f"more than {MAX_DEVICES} devices"))
            continue
        with search_progress(progress and name == "hpp") as report:
            results.append(plan(problem, name, report))
    if not any(r.feasible for r in results):
        raise SpecError(explain_infeasible(problem_from(args)))
    return results


def run(args: argparse.Namespace) -> int:
    if args.plot:
        check_output_file(args.plot, "--plot")
    results = compare(args, progress=not args.json)
    entries = [r.entry() for r in results]
    if args.plot:
        from hetpp.report.charts import comparison_chart

        comparison_chart(entries, args.plot)
    if args.json:
        print(json.dumps(entries, indent=1))
    else:
        Console().print(comparison_table(results))
        if args.plot:
            print(f"chart written to {args.plot}")
    return 0
