"""`hetpp plan`: find the fastest plan for a model on a cluster; print it and write the file."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from hetpp.cli._options import add_problem_arguments, problem_from, search_progress
from hetpp.planner import STRATEGIES, Problem, plan, unused_devices
from hetpp.planner.assemble import PlanResult
from hetpp.planner.feasibility import explain_infeasible
from hetpp.specs.errors import SpecError
from hetpp.specs.io import check_output_file

EXAMPLES = """examples:
  hetpp plan --cluster cluster.yaml --model llama2-7b --global-batch 512
  hetpp plan --cluster cluster.yaml --model gpt3-13b --global-batch 1024 --seq-len 2048 \\
      --strategy hpp --micro-batch-sizes 1,2,4 --out plan.json
  hetpp plan --cluster c.yaml --model ./config.json --global-batch 256 --profile a100.csv --json
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
        choices=STRATEGIES,
        default="hpp",
        help="hpp (default), a baseline, or the exhaustive oracle (small clusters only)",
    )
    p.add_argument("--out", default="plan.json", help="plan file to write (default plan.json)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(func=run)


def run_strategy(
    problem: Problem, strategy: str, progress: Callable[[float, str], None] | None = None
) -> PlanResult:
    """One strategy; SpecError with the reason when nothing fits."""
    result = plan(problem, strategy, progress)
    if not result.feasible:
        raise SpecError(explain_infeasible(problem, result.note))
    return result


def run(args: argparse.Namespace) -> int:
    check_output_file(args.out, "--out")
    problem = problem_from(args)
    with search_progress(not args.json) as report:
        result = run_strategy(problem, args.strategy, report)
    final = result.final_plan()
    assert final is not None
    final.save(args.out)
    if args.json:
        entry = result.entry()
        entry["unused_devices"] = unused_devices(problem, final)
        entry["out"] = args.out
        print(json.dumps(entry, indent=1))
    else:
        print_plan(problem, result)
        print(f"plan written to {args.out}")
    return 0


def print_plan(problem: Problem, result: PlanResult) -> None:
    """Rich table of one plan: pipelines (identical ones on one row group), stages with GPU type,
    devices and layers, batch shares, memory headroom; then time, throughput, search time."""
    from rich.console import Console
    from rich.table import Table

    plan, step = result.final_plan(), result.step
    assert plan is not None and step is not None
    cl = problem.cluster
    table = Table(
        title=f"{plan.strategy} plan: {plan.model.name}, {cl.name}, "
        f"global batch {plan.global_batch} x {plan.seq_len} tokens",
        caption="identical pipelines share rows: pipes = how many, batch = each one's share",
    )
    for col in ("pipes", "stage", "GPU", "devices", "layers", "mbs x m", "batch", "free mem"):
        right = col in ("pipes", "stage", "batch", "free mem")
        table.add_column(col, justify="right" if right else "left", no_wrap=True, min_width=4)
    costs = {(s.pipeline, s.stage): s for s in step.stages}
    groups: dict[tuple, list[int]] = {}
    for p, pipe in enumerate(plan.pipelines):
        shape = tuple((cl.gpu(st.device).name, st.layers) for st in pipe.stages)
        groups.setdefault((shape, pipe.micro_batch_size, pipe.num_micro_batches), []).append(p)
    for (shape, mbs, m), members in groups.items():
        for s, (gpu, layers) in enumerate(shape):
            free = min(costs[(p, s)].capacity_bytes - costs[(p, s)].memory.total for p in members)
            first = s == 0
            table.add_row(
                str(len(members)) if first else "",
                str(s),
                gpu,
                _brief(sorted(plan.pipelines[p].stages[s].device for p in members)),
                f"[{layers[0]}, {layers[1]})",
                f"{mbs} x {m}" if first else "",
                str(mbs * m) if first else "",
                f"{free / 1e9:.1f} GB",
            )
        table.add_section()
    console = Console()
    console.print(table)
    unused = unused_devices(problem, plan)
    console.print(
        f"iteration {step.iteration_time_s:.3f} s (pipelines {max(step.pipeline_time_s):.3f} s, "
        f"exposed sync {step.exposed_sync_s:.3f} s, optimizer {step.optimizer_s:.3f} s), "
        f"throughput {step.throughput_samples_per_s:.2f} samples/s, "
        f"recompute {'on' if plan.train.recompute else 'off'}, search {result.search_time_s:.2f} s"
    )
    if unused:
        console.print(f"unused devices: {_ranges(unused)}")
    if result.note:
        console.print(f"note: {result.note}")


def _brief(ids: list[int], width: int = 11) -> str:
    """Id ranges, or first..last with the count when that would not fit a table cell."""
    text = _ranges(ids)
    return text if len(text) <= width else f"{ids[0]}..{ids[-1]}"


def _ranges(ids: list[int]) -> str:
    out, start = [], None
    for i, d in enumerate(ids):
        if start is None:
            start = d
        if i + 1 == len(ids) or ids[i + 1] != d + 1:
            out.append(f"{start}" if start == d else f"{start}-{d}")
            start = None
    return ", ".join(out)
