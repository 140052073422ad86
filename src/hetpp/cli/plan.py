"""`hetpp plan`: find the fastest plan for a model on a cluster; print it and write the file.

Also home of the options `plan` and `compare` share (`add_problem_arguments`, `problem_from`),
so the two commands parse the same way.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from contextlib import contextmanager

from hetpp.planner import STRATEGIES, Problem, plan, unused_devices
from hetpp.planner.assemble import PlanResult
from hetpp.planner.feasibility import explain_infeasible
from hetpp.planner.problem import DEFAULT_MICRO_BATCH_SIZES
from hetpp.profile.table import load_profiles
from hetpp.specs.cluster import load_cluster
from hetpp.specs.errors import SpecError
from hetpp.specs.presets import load_model_config
from hetpp.specs.train import DTYPE_BYTES, TrainSpec

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


def add_problem_arguments(p: argparse.ArgumentParser) -> None:
    """The options that describe a planning problem (shared by `plan` and `compare`)."""
    p.add_argument("--cluster", required=True, help="cluster YAML file")
    p.add_argument(
        "--model", required=True, help="preset name or Hugging Face config.json (or hetpp YAML)"
    )
    p.add_argument(
        "--global-batch", type=int, required=True, help="samples (sequences) per optimizer step"
    )
    p.add_argument(
        "--seq-len", type=int, help="tokens per sample (default: 2048, or the model's maximum)"
    )
    p.add_argument(
        "--micro-batch-sizes",
        type=_int_list,
        default=DEFAULT_MICRO_BATCH_SIZES,
        metavar="1,2,4,8",
        help="candidate micro-batch sizes (default 1,2,4,8)",
    )
    p.add_argument(
        "--profile",
        nargs="+",
        default=[],
        metavar="CSV",
        help="measured profiles; they replace the estimate for their GPU types",
    )
    p.add_argument(
        "--recompute",
        choices=("auto", "on", "off"),
        default="auto",
        help="activation recomputation: auto plans both ways and keeps the faster",
    )
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    p.add_argument("--precision", choices=tuple(DTYPE_BYTES), default="bf16")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,2,4, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def problem_from(args: argparse.Namespace) -> Problem:
    """Build the planning problem from parsed options (files read and validated here)."""
    from hetpp.specs.model import ModelSpec

    cluster = load_cluster(args.cluster)
    config = load_model_config(args.model)
    seq_len = args.seq_len or min(2048, config.max_seq_len)
    if args.global_batch < 1:
        raise SpecError("must be positive", field="--global-batch")
    if seq_len > config.max_seq_len:
        raise SpecError(
            f"{seq_len} exceeds {config.name}'s max_seq_len {config.max_seq_len}", field="--seq-len"
        )
    train = TrainSpec(
        global_batch=args.global_batch,
        seq_len=seq_len,
        precision=args.precision,
        schedule=args.schedule,
    )
    model = ModelSpec(config=config, seq_len=seq_len, dtype_bytes=DTYPE_BYTES[args.precision])
    return Problem(
        model=model,
        cluster=cluster,
        train=train,
        micro_batch_sizes=args.micro_batch_sizes,
        recompute_mode=args.recompute,
        profiles=load_profiles(args.profile) if args.profile else None,
    )


@contextmanager
def search_progress(enabled: bool = True):
    """A transient progress bar on stderr; yields the callback the search reports to."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("searching", total=1.0)

        def report(fraction: float, what: str) -> None:
            bar.update(task, completed=fraction, description=f"searching: {what}")

        yield report


def run_strategy(
    problem: Problem, strategy: str, progress: Callable[[float, str], None] | None = None
) -> PlanResult:
    """One strategy; SpecError with the reason when nothing fits."""
    result = plan(problem, strategy, progress)
    if not result.feasible:
        raise SpecError(explain_infeasible(problem, result.note))
    return result


def run(args: argparse.Namespace) -> int:
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
        f"recompute {'on' if plan.recompute else 'off'}, search {result.search_time_s:.2f} s"
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
