"""`hetpp compare`: every planner strategy on one problem, side by side."""

from __future__ import annotations

import argparse
import json

from hetpp.cli._options import add_problem_arguments, problem_from, search_progress
from hetpp.planner import STRATEGIES, plan
from hetpp.planner.assemble import PlanResult
from hetpp.planner.feasibility import explain_infeasible
from hetpp.planner.oracle import MAX_DEVICES
from hetpp.specs.errors import SpecError
from hetpp.specs.io import check_output_file

EXAMPLES = """examples:
  hetpp compare --cluster cluster.yaml --model gpt3-13b --global-batch 1024
  hetpp compare --cluster cluster.yaml --model llama2-7b --global-batch 512 --json
  hetpp compare --cluster cluster.yaml --model gpt3-6.7b --global-batch 512 --plot compare.png
"""

ORDER = ("uniform", "layer-balanced", "data-balanced", "hpp", "oracle")


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
    assert set(ORDER) == set(STRATEGIES)
    results = []
    for name in ORDER:
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
        print_comparison(results)
        if args.plot:
            print(f"chart written to {args.plot}")
    return 0


def print_comparison(results: list[PlanResult]) -> None:
    """Rich table: throughput, iteration time, hpp's speed-up over each (hpp gain), pipelines,
    GPUs used and search time."""
    from rich.console import Console
    from rich.table import Table

    hpp = next(r for r in results if r.strategy == "hpp")
    table = Table(title="planner strategies (same cost model)")
    for col in ("strategy", "samples/s", "step", "hpp gain", "pipes", "GPUs", "search"):
        table.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    for r in results:
        if not r.feasible or r.plan is None:
            table.add_row(r.strategy, "-", "-", "-", "-", "-", f"({r.note or 'infeasible'})")
            continue
        speedup = hpp.throughput_samples_per_s / r.throughput_samples_per_s if hpp.feasible else 0
        table.add_row(
            r.strategy,
            f"{r.throughput_samples_per_s:.2f}",
            f"{r.iteration_time_s:.3f} s",
            f"{speedup:.2f}x" if speedup else "-",
            str(len(r.plan.pipelines)),
            str(r.plan.num_devices),
            f"{r.search_time_s:.2f} s",
        )
    Console().print(table)
