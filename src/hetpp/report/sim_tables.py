"""Rich tables for `hetpp simulate`: step summary, then per device (or per GPU type when many)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from hetpp.sim.result import DeviceStats, SimResult

GB = 1e9
MAX_DEVICE_ROWS = 64
"""Beyond this many devices the table groups devices by GPU type."""


def _memory_cell(d: DeviceStats) -> str:
    text = f"{d.peak_memory_bytes / GB:.1f}/{d.memory_capacity_bytes / GB:.0f}"
    return text if d.fits else f"[red]{text} OVER[/red]"


def device_table(result: SimResult) -> Table:
    """One row per device: where it sits, how its time splits (busy = forward, backward and
    optimizer; sync = inside all-reduces), micro-batches held at once, peak memory / capacity."""
    t = Table(title="Per device (simulated)", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("where", "dev", "GPU", "layers", "busy", "sync", "idle", "held"):
        t.add_column(
            col,
            justify="right" if col in ("dev", "busy", "sync", "idle", "held") else "left",
            no_wrap=True,
        )
    t.add_column("peak/cap GB", justify="right", no_wrap=True)
    for d in result.devices:
        t.add_row(
            f"P{d.pipeline} S{d.stage}",
            str(d.device),
            d.gpu,
            f"[{d.layers[0]},{d.layers[1]})",
            f"{d.busy_fraction:.0%}",
            f"{d.sync_fraction:.0%}",
            f"{d.idle_fraction:.0%}",
            str(d.max_in_flight),
            _memory_cell(d),
        )
    return t


def type_table(result: SimResult) -> Table:
    """One row per GPU type: device count, busy share (mean, min, max), worst memory headroom."""
    t = Table(title="Per GPU type (simulated)", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("GPU", "devices", "busy mean", "busy min", "busy max", "peak max GB", "over"):
        t.add_column(col, justify="left" if col == "GPU" else "right")
    for gpu in sorted({d.gpu for d in result.devices}):
        ds = [d for d in result.devices if d.gpu == gpu]
        busy = [d.busy_fraction for d in ds]
        worst = max(ds, key=lambda d: d.peak_memory_bytes / d.memory_capacity_bytes)
        over = sum(not d.fits for d in ds)
        t.add_row(
            gpu,
            str(len(ds)),
            f"{sum(busy) / len(busy):.0%}",
            f"{min(busy):.0%}",
            f"{max(busy):.0%}",
            _memory_cell(worst),
            f"[red]{over}[/red]" if over else "0",
        )
    return t


def summary_lines(result: SimResult, closed_form_s: float | None = None) -> list[str]:
    """Per-pipeline times, then the step: iteration, throughput, bubble, exposed sync, memory."""
    out = _pipeline_lines(result.pipeline_time_s)
    out.append(
        f"iteration {result.iteration_time_s:.4f} s -> "
        f"{result.throughput_samples_per_s:.2f} samples/s  (bubble {result.bubble_fraction:.1%}, "
        f"exposed sync {result.exposed_sync_s:.4f} s)"
    )
    if closed_form_s is not None:
        diff = (closed_form_s - result.iteration_time_s) / result.iteration_time_s
        out.append(f"cost model's closed form: {closed_form_s:.4f} s ({diff:+.2%} vs simulated)")
    over = [d.device for d in result.devices if not d.fits]
    if over:
        shown = ", ".join(map(str, over[:16])) + (
            f" and {len(over) - 16} more" if len(over) > 16 else ""
        )
        out.append(f"[red]memory exceeded on device(s) {shown}[/red]")
    return out


def _pipeline_lines(times: tuple[float, ...]) -> list[str]:
    """One line per run of consecutive pipelines with the same time (identical shapes)."""
    out, start = [], 0
    for p in range(1, len(times) + 1):
        if p == len(times) or abs(times[p] - times[start]) > 1e-9 * times[start]:
            who = f"pipeline {start}" if p - start == 1 else f"pipelines {start}-{p - 1}"
            out.append(f"{who}: {times[start]:.4f} s")
            start = p
    return out


def print_simulation(
    result: SimResult, closed_form_s: float | None = None, console: Console | None = None
) -> None:
    """Tables and summary for people."""
    console = console or Console()
    many = len(result.devices) > MAX_DEVICE_ROWS
    console.print(type_table(result) if many else device_table(result))
    for line in summary_lines(result, closed_form_s):
        console.print(line)
