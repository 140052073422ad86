"""Options several commands share, so they parse the same way (not a command: `main` skips
modules whose name starts with an underscore)."""

from __future__ import annotations

import argparse
from contextlib import contextmanager

from hetpp.planner import Problem
from hetpp.planner.problem import DEFAULT_MICRO_BATCH_SIZES
from hetpp.profile.table import load_profiles
from hetpp.specs.cluster import load_cluster
from hetpp.specs.errors import SpecError
from hetpp.specs.io import validate_model
from hetpp.specs.presets import load_model_config
from hetpp.specs.schedule import SCHEDULES
from hetpp.specs.trainspec import DTYPE_BYTES, TrainSpec
from hetpp.specs.values import non_negative_float, positive_float, positive_int


def add_profile_argument(p: argparse.ArgumentParser) -> None:
    """`--profile CSV ...`: measured profiles that replace the estimate for their GPU types."""
    p.add_argument(
        "--profile",
        nargs="+",
        default=[],
        metavar="CSV",
        help="measured profiles; they replace the estimate for their GPU types",
    )


def add_problem_arguments(p: argparse.ArgumentParser) -> None:
    """The options that describe a planning problem (shared by `plan` and `compare`)."""
    p.add_argument("--cluster", required=True, help="cluster YAML file")
    p.add_argument(
        "--model",
        required=True,
        help="preset name, Hugging Face model folder or config.json (or hetpp YAML)",
    )
    p.add_argument(
        "--global-batch",
        type=positive_int,
        required=True,
        help="samples (sequences) per optimizer step",
    )
    p.add_argument(
        "--seq-len",
        type=positive_int,
        help="tokens per sample (default: 2048, or the model's maximum)",
    )
    p.add_argument(
        "--micro-batch-sizes",
        type=int_list,
        default=DEFAULT_MICRO_BATCH_SIZES,
        metavar="1,2,4,8",
        help="candidate micro-batch sizes (default 1,2,4,8)",
    )
    add_profile_argument(p)
    p.add_argument(
        "--recompute",
        choices=("auto", "on", "off"),
        default="auto",
        help="activation recomputation: auto plans both ways and keeps the faster",
    )
    p.add_argument(
        "--sharding",
        choices=("auto", "none", "optimizer", "targeted"),
        default=None,
        help="optimizer sharding over block owners (ZeRO-1): none, optimizer, auto: try it "
        "where memory or time says so and keep the faster, or targeted: the unsharded plan's "
        "schedule pass once more sharded, kept where 1%% faster (in bf16/fp16 a sharded plan "
        "keeps half-precision parameters and gradients, fp32 masters in the optimizer: "
        "--master-weights optimizer). Default: targeted (none with --tp auto); `hetpp plan` "
        "retries with auto when no plan fits, and says so",
    )
    p.add_argument(
        "--master-weights",
        choices=("params", "optimizer"),
        default="params",
        help="bf16/fp16: params (default): fp32 parameters are the master weights, autocast, "
        "fp32 gradients (2 + 4 + 12 B/param); optimizer: half-precision parameters and "
        "gradients, fp32 masters in the optimizer (2 + 2 + 12)",
    )
    p.add_argument(
        "--tp",
        choices=("off", "auto"),
        default="off",
        help="tensor parallelism inside stages: auto searches a degree (1, 2, 4, 8 within a "
        "node) per GPU type (default off); hetpp train runs a plan whose pipelines each have "
        "one degree",
    )
    p.add_argument(
        "--whole-blocks",
        action="store_true",
        help="stages end at whole blocks only (default: hpp may end a stage between a block's "
        "attention and MLP where that is faster; the plan's model then says layer_unit half)",
    )
    one_chunk = tuple(n for n, s in SCHEDULES.items() if not s.multi_stage)
    p.add_argument("--schedule", choices=one_chunk, default=one_chunk[0])
    p.add_argument(
        "--try-schedules",
        nargs="*",
        metavar="NAME",
        choices=tuple(n for n in SCHEDULES if n not in one_chunk),
        help="schedules the planner may give each pipeline (interleaved, V, zbh1); "
        "default: those hetpp train runs; none: one-chunk only",
    )
    p.add_argument("--precision", choices=tuple(DTYPE_BYTES), default="bf16")
    p.add_argument(
        "--reserve-gb",
        type=non_negative_float,
        default=TrainSpec.model_fields["reserve_gb"].default,
        help="memory held back per device for context and workspaces (default 2 GB)",
    )


def int_list(text: str) -> tuple[int, ...]:
    """argparse type of a list of positive integers like `1,2,4`."""
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
    if seq_len > config.max_seq_len:
        raise SpecError(
            f"{seq_len} exceeds {config.name}'s max_seq_len {config.max_seq_len}", field="--seq-len"
        )
    options = dict(
        global_batch=args.global_batch,
        seq_len=seq_len,
        precision=args.precision,
        master_weights=args.master_weights,
        schedule=args.schedule,
        reserve_gb=args.reserve_gb,
    )
    train = validate_model(TrainSpec, options)
    model = ModelSpec(config=config, seq_len=seq_len, dtype_bytes=DTYPE_BYTES[args.precision])
    return Problem(
        model=model,
        cluster=cluster,
        train=train,
        micro_batch_sizes=args.micro_batch_sizes,
        recompute_mode=args.recompute,
        sharding_mode=args.sharding or ("none" if args.tp == "auto" else "targeted"),
        profiles=load_profiles(args.profile) if args.profile else None,
        schedules=None if args.try_schedules is None else tuple(args.try_schedules),
        tp_search=args.tp == "auto",
        half_blocks=not args.whole_blocks,
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


def add_time_limit_argument(p: argparse.ArgumentParser) -> None:
    """`--time-limit SECONDS`: the hpp search returns the best plan found by then."""
    p.add_argument(
        "--time-limit",
        type=positive_float,
        metavar="SECONDS",
        help="stop the hpp search after about this long and keep the best plan found so far",
    )
