"""`hetpp profile`: measure a model's layers on this machine's device into a profile CSV."""

from __future__ import annotations

import argparse

from hetpp.cli._options import int_list
from hetpp.runtime.preflight import host_memory_bytes
from hetpp.specs.catalog import catalog_name_for_device
from hetpp.specs.errors import SpecError
from hetpp.specs.io import check_output_file
from hetpp.specs.model import ModelConfig, ModelSpec
from hetpp.specs.values import positive_int

EXAMPLES = """examples:
  hetpp profile --model tiny-gpt --device cpu --seq-len 128 --out cpu.csv
  hetpp profile --model gpt3-1.3b --device cuda --micro-batch-sizes 1,2,4,8 --out a100.csv
  hetpp profile --model gpt3-1.3b --device cuda --gpu-name MyA100 --out a100.csv
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile",
        help="measure embedding, block and head times and memory on this device",
        description="Time the runtime's own layer modules (forward, backward, kept activation "
        "bytes) per micro-batch size and write a profile CSV the planner reads.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="preset name or model config file")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--micro-batch-sizes", type=int_list, default=(1, 2, 4), metavar="1,2,4")
    p.add_argument(
        "--seq-len", type=positive_int, help="default: the model's max_seq_len, at most 2048"
    )
    p.add_argument(
        "--gpu-name",
        help="GPU type the rows are for, as the cluster file names it (default: the catalog "
        "type of the CUDA device, e.g. A100-80GB on an 'NVIDIA A100-SXM4-80GB'; CPU on the CPU)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="default float32 on cpu, bfloat16 on cuda",
    )
    p.add_argument(
        "--repeats", type=positive_int, default=5, help="timed runs per point (median taken)"
    )
    p.add_argument("--out", required=True, help="CSV file to write")
    p.set_defaults(func=run)


def _check_fits(
    config: ModelConfig, seq_len: int, mbs: int, dtype_bytes: int, free: int | None
) -> None:
    """Refuse a micro-batch whose activations (the largest layer's kept bytes and the float32
    logits) cannot fit where it would run, instead of allocating until killed."""
    spec = ModelSpec(config=config, seq_len=seq_len, dtype_bytes=dtype_bytes)
    per_sample = (
        max(x.saved_bytes_per_sample for x in spec.layers) + 4 * config.vocab_size * seq_len
    )
    need = per_sample * mbs
    if free is not None and need > free:
        raise SpecError(
            f"micro-batch size {mbs} needs about {need / 1e9:,.1f} GB of activations, more than "
            f"the {free / 1e9:,.1f} GB available here",
            field="--micro-batch-sizes",
        )


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.progress import Progress

    from hetpp.profile.table import ProfileTable
    from hetpp.runtime.profiler import KINDS, profile_model
    from hetpp.specs.presets import load_model_config

    config = load_model_config(args.model)
    seq_len = args.seq_len or min(config.max_seq_len, 2048)
    if not 1 <= seq_len <= config.max_seq_len:
        raise SpecError(
            f"must be in 1..{config.max_seq_len} (the model's max_seq_len)", field="--seq-len"
        )
    check_output_file(args.out, "--out")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SpecError("CUDA is not available on this machine", field="--device")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else host_memory_bytes()
    _check_fits(config, seq_len, max(args.micro_batch_sizes), dtype.itemsize, free)
    gpu = args.gpu_name or _default_gpu_name(device)
    total = len(KINDS) * len(args.micro_batch_sizes)
    with Progress() as progress:
        task = progress.add_task(f"profiling {config.name} on {gpu}", total=total)

        def done(row):
            progress.console.print(
                f"{row.layer:9s} mbs {row.mbs:3d}: fwd {row.fwd_s * 1e3:8.3f} ms  "
                f"bwd {row.bwd_s * 1e3:8.3f} ms  kept {row.act_bytes / 2**20:8.2f} MiB"
            )
            progress.advance(task)

        rows = profile_model(
            config,
            gpu,
            args.micro_batch_sizes,
            seq_len,
            device,
            dtype,
            repeats=args.repeats,
            on_row=done,
        )
    ProfileTable(rows).save(args.out)
    print(f"wrote {len(rows)} rows for GPU type {gpu} to {args.out}")
    return 0


def _default_gpu_name(device) -> str:
    """The catalog type of the CUDA device (what cluster files name it), or "CPU"."""
    if device.type == "cpu":
        return "CPU"
    import torch

    name = torch.cuda.get_device_name(device)
    found = catalog_name_for_device(name)
    if found is None:
        raise SpecError(
            f"this device ({name!r}) matches no catalog GPU type; give the type name your "
            "cluster file uses for it",
            field="--gpu-name",
        )
    return found
