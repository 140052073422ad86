"""Rich tables for people and plain dicts for `--json`, from the cost model's step breakdown."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from hetpp.cost.step import StepCost, device_memories

GB = 1e9


def step_table(step: StepCost, title: str = "Per stage") -> Table:
    """One row per stage: device, GPU, layers, per-micro-batch times, memory and headroom."""
    t = Table(title=title, title_justify="left")
    for col in (
        "pipe",
        "stage",
        "device",
        "GPU",
        "layers",
        "fwd ms",
        "bwd ms",
        "send ms",
        "memory GB",
        "capacity GB",
        "headroom GB",
    ):
        t.add_column(col, justify="left" if col in ("GPU", "layers") else "right")
    for s in step.stages:
        head = (s.capacity_bytes - s.memory.total) / GB
        t.add_row(
            str(s.pipeline),
            str(s.stage),
            str(s.device),
            s.gpu,
            f"[{s.layers[0]}, {s.layers[1]})",
            f"{s.fwd_s * 1e3:.2f}",
            f"{s.bwd_s * 1e3:.2f}",
            f"{s.send_s * 1e3:.3f}",
            f"{s.memory.total / GB:.2f}",
            f"{s.capacity_bytes / GB:.1f}",
            f"{head:.2f}" if head >= 0 else f"[red]{head:.2f} OVER[/red]",
        )
    return t


def sync_table(step: StepCost) -> Table:
    """Gradient buckets: owners, blocks, size and when each all-reduce (sharded: reduce-scatter)
    runs, then a sharded plan's all-gathers of updated parameters."""
    t = Table(title="Block-wise gradient sync", title_justify="left")
    for col in ("owners", "layer blocks", "MB", "ready s", "start s", "end s"):
        t.add_column(col, justify="left" if col in ("owners", "layer blocks") else "right")
    rows = [(b, "") for b in step.buckets] + [(b, " all-gather") for b in step.gathers]
    for b, what in rows:
        blocks = (", ".join(f"[{a},{e})" for a, e in b.blocks) or "tied embedding/head") + what
        t.add_row(
            ",".join(map(str, b.owners)),
            blocks,
            f"{b.bytes / 1e6:.1f}",
            f"{b.ready_s:.4f}",
            f"{b.start_s:.4f}",
            f"{b.end_s:.4f}",
        )
    return t


def summary_lines(step: StepCost, batches: list[tuple[int, int]]) -> list[str]:
    """Per-pipeline time and batch share, then the step totals."""
    out = []
    for p, (t, (mbs, m)) in enumerate(zip(step.pipeline_time_s, batches)):
        out.append(f"pipeline {p}: {m} micro-batches of {mbs} ({mbs * m} samples), {t:.4f} s")
    out.append(
        f"iteration {step.iteration_time_s:.4f} s  (exposed sync {step.exposed_sync_s:.4f} s, "
        f"optimizer {step.optimizer_s:.4f} s)  ->  {step.throughput_samples_per_s:.2f} samples/s"
    )
    if not step.fits:
        # by device, over every stage it runs: a device of two stages that each fit alone can
        # overfill (a V's turn), and a list of stages alone would then name none
        over = [d for d, (mem, cap) in device_memories(step.stages).items() if mem.total > cap]
        out.append(f"[red]memory exceeded on device(s) {sorted(over)}[/red]")
    return out


def step_dict(step: StepCost) -> dict[str, Any]:
    """JSON-ready breakdown of a step."""
    return {
        "iteration_time_s": step.iteration_time_s,
        "throughput_samples_per_s": step.throughput_samples_per_s,
        "pipeline_time_s": list(step.pipeline_time_s),
        "exposed_sync_s": step.exposed_sync_s,
        "optimizer_s": step.optimizer_s,
        "fits_memory": step.fits,
        "stages": [
            {
                "pipeline": s.pipeline,
                "stage": s.stage,
                "device": s.device,
                "gpu": s.gpu,
                "layers": list(s.layers),
                "fwd_s": s.fwd_s,
                "bwd_s": s.bwd_s,
                "send_s": s.send_s,
                "memory_bytes": s.memory.total,
                "memory": s.memory._asdict(),
                "memory_capacity_bytes": s.capacity_bytes,
            }
            for s in step.stages
        ],
        "sync_buckets": [
            {
                "owners": list(b.owners),
                "blocks": [list(x) for x in b.blocks],
                "bytes": b.bytes,
                "ready_s": b.ready_s,
                "start_s": b.start_s,
                "end_s": b.end_s,
            }
            for b in step.buckets
        ],
        "parameter_gathers": [
            {"owners": list(b.owners), "bytes": b.bytes, "start_s": b.start_s, "end_s": b.end_s}
            for b in step.gathers
        ],
    }


def print_step(
    step: StepCost, batches: list[tuple[int, int]], console: Console | None = None
) -> None:
    console = console or Console()
    console.print(step_table(step))
    console.print(sync_table(step))
    for line in summary_lines(step, batches):
        console.print(line)
