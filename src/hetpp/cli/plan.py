"""`hetpp plan`: find the fastest plan for a model on a cluster; print it and write the file."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace

from hetpp.cli._options import (
    add_problem_arguments,
    add_time_limit_argument,
    problem_from,
    search_progress,
)
from hetpp.planner import BEST, FAMILIES, STRATEGIES, Problem, plan, unused_devices
from hetpp.planner.assemble import PlanResult
from hetpp.planner.feasibility import explain_infeasible
from hetpp.report.launch import launch_commands
from hetpp.report.plans import print_plan
from hetpp.specs.errors import SpecError
from hetpp.specs.io import check_output_file

EXAMPLES = """examples:
  hetpp plan --cluster cluster.yaml --model llama2-7b --global-batch 512
  hetpp plan --cluster cluster.yaml --model gpt3-13b --global-batch 1024 --seq-len 2048 \\
      --strategy hpp --micro-batch-sizes 1,2,4 --out plan.json
  hetpp plan --cluster c.yaml --model ./config.json --global-batch 256 --profile a100.csv --json
  hetpp plan --cluster big.yaml --model llama2-13b --global-batch 4096 --time-limit 5
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="find the fastest plan (pipelines, layer splits, batch shares) for a cluster",
        description="Search pipelines of different shapes over a heterogeneous cluster, a "
        "memory-feasible layer split in each and a batch share per pipeline, ranked by the cost "
        "model's full step time (block-wise gradient sync and optimizer included). Prints the "
        "plan and writes it as JSON for `hetpp estimate`, `hetpp simulate` and `hetpp train`.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_problem_arguments(p)
    p.add_argument(
        "--strategy",
        choices=[BEST, *STRATEGIES],
        default=BEST,
        help=f"{BEST} (default: the fastest of {', '.join(FAMILIES)}), one family, a baseline, "
        "or the exhaustive oracle (small clusters only)",
    )
    add_time_limit_argument(p)
    p.add_argument("--out", default="plan.json", help="plan file to write (default plan.json)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(func=run)


def run_strategy(
    problem: Problem,
    strategy: str,
    progress: Callable[[float, str], None] | None = None,
    time_limit_s: float | None = None,
) -> PlanResult:
    """One strategy; SpecError with the reason when nothing fits."""
    result = plan(problem, strategy, progress, time_limit_s)
    if not result.feasible:
        raise SpecError(explain_infeasible(problem, result.note))
    return result


def run(args: argparse.Namespace) -> int:
    check_output_file(args.out, "--out")
    problem = problem_from(args)
    fell_back = False
    with search_progress(not args.json) as report:
        try:
            result = run_strategy(problem, args.strategy, report, args.time_limit)
        except SpecError:
            if not _may_fall_back(args, problem):
                raise
            # A model too big for whole replicas: a sharded plan beats no plan, and the
            # precision change it can bring is printed, not silent.
            problem = replace(problem, sharding_mode="auto")
            result = run_strategy(problem, args.strategy, report, args.time_limit)
            fell_back = True
    final = result.final_plan()
    assert final is not None
    final.save(args.out)
    if args.json:
        entry = result.entry()
        entry["unused_devices"] = unused_devices(problem, final)
        entry["out"] = args.out
        entry["launch"] = launch_commands(problem.cluster, args.out)
        print(json.dumps(entry, indent=1))
    else:
        print_plan(problem, result)
        print(f"plan written to {args.out}")
        print("to train it, on each node (NODE0_HOST: node 0's address):")
        print("\n".join(f"  {c}" for c in launch_commands(problem.cluster, args.out)))
    if fell_back:
        print(FALLBACK_NOTE, file=sys.stderr)
    return 0


FALLBACK_NOTE = (
    "note: no plan fits with whole replicas of the optimizer state (--sharding none); this plan "
    "comes from --sharding auto (ZeRO-1 over block owners; in bf16/fp16 with half-precision "
    "parameters and gradients and fp32 masters in the optimizer). Pass --sharding none to refuse."
)


def _may_fall_back(args: argparse.Namespace, problem: Problem) -> bool:
    """Whether an infeasible default search is retried sharded: only when --sharding was not
    given, and not with TP (which is not combined with sharding)."""
    return args.sharding is None and not (problem.tp_search or problem.has_tp)
