"""PNG charts: the simulator's Gantt chart, strategy throughput, predicted against measured.

matplotlib is imported inside each function and only through `matplotlib.figure.Figure`, which
renders with Agg on its own: no pyplot state, no display needed, and commands that draw nothing
start without paying for the import.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hetpp.sim.result import SimResult
from hetpp.sim.trace import Kind

MAX_GANTT_ROWS = 64
"""Beyond this many devices the Gantt chart is summarised per GPU type."""

COLORS = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "send/recv": "#222222",
    "all-reduce": "#E45756",
    "optimizer": "#B279A2",
    "all-gather": "#54A24B",
    "idle": "#E8E8E8",
}
_KIND_NAME = {
    Kind.F: "forward",
    Kind.B: "backward",
    Kind.SYNC: "all-reduce",
    Kind.OPT: "optimizer",
    Kind.GATHER: "all-gather",
}


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _legend(fig, names: Sequence[str]) -> None:
    from matplotlib.patches import Patch

    fig.legend(
        handles=[Patch(color=COLORS[n], label=n) for n in names],
        ncol=len(names),
        fontsize=8,
        frameon=False,
        loc="outside lower center",
    )


def gantt_chart(result: SimResult, path: str | Path, title: str | None = None) -> Path:
    """Write the step's timeline as a PNG: one row per device (grouped by pipeline, labelled with
    its GPU type), or one utilisation panel per GPU type beyond MAX_GANTT_ROWS devices."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = (
        f"{title + ' - ' if title else ''}iteration {result.iteration_time_s:.3f} s, "
        f"bubble {result.bubble_fraction:.0%}, exposed sync {result.exposed_sync_s * 1e3:.0f} ms"
    )
    if len(result.devices) <= MAX_GANTT_ROWS:
        fig = _device_rows(result, head)
    else:
        fig = _type_summary(result, head)
    fig.savefig(path)
    return path


def _device_rows(result: SimResult, title: str):
    tr, n = result.trace, len(result.devices)
    fig = _figure(12, 1.2 + 0.28 * n)
    ax = fig.add_subplot()
    end = result.iteration_time_s
    for r in range(n):
        y = n - 1 - r  # first device on top
        ax.broken_barh([(0, end)], (y - 0.4, 0.8), color=COLORS["idle"], lw=0)
        mine = tr.rank == r
        for code, name in _KIND_NAME.items():
            sel = mine & (tr.kind == code)
            spans = np.c_[tr.start[sel], tr.end[sel] - tr.start[sel]]
            if len(spans):
                # white hairlines keep back-to-back micro-batches apart
                ax.broken_barh(spans, (y - 0.4, 0.8), fc=COLORS[name], ec="white", lw=0.3)
        t = tr.transfers
        sel = (t.src == r) | (t.dst == r)
        if sel.any():  # a thin strip under the row: the link is busy with this rank's message
            spans = np.c_[t.start[sel], t.end[sel] - t.start[sel]]
            ax.broken_barh(spans, (y - 0.4, 0.16), color=COLORS["send/recv"], lw=0)
    labels = [f"P{d.pipeline} S{d.stage}  dev {d.device}  {d.gpu}" for d in result.devices]
    ax.set_yticks(range(n)[::-1], labels, fontsize=7 if n > 24 else 8)
    for r in range(1, n):  # a rule between pipelines
        if result.devices[r].pipeline != result.devices[r - 1].pipeline:
            ax.axhline(n - r - 0.5, color="#555555", lw=0.8)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlim(0, end * 1.005)
    ax.set_xlabel("time (s)")
    ax.set_title(title, fontsize=10, loc="left")
    _legend(fig, list(COLORS))
    return fig


def _covered(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Seconds of the intervals inside each bin [edges[i], edges[i+1])."""

    def integral(t: np.ndarray, points: np.ndarray) -> np.ndarray:
        # sum over points p < t of (t - p), for every t, from sorted prefix sums
        pts = np.sort(points)
        cum = np.r_[0.0, np.cumsum(pts)]
        k = np.searchsorted(pts, t)
        return t * k - cum[k]

    total = integral(edges, start) - integral(edges, end)
    return np.diff(total)


def _type_summary(result: SimResult, title: str):
    tr = result.trace
    gpus = sorted({d.gpu for d in result.devices})
    fig = _figure(12, 1.2 + 2.0 * len(gpus))
    axes = fig.subplots(len(gpus), 1, sharex=True, squeeze=False)[:, 0]
    edges = np.linspace(0, result.iteration_time_s, 401)
    width = np.diff(edges)
    for ax, gpu in zip(axes, gpus):
        ranks = np.array([r for r, d in enumerate(result.devices) if d.gpu == gpu])
        of_type = np.isin(tr.rank, ranks)
        shares = []
        for code, name in _KIND_NAME.items():
            sel = of_type & (tr.kind == code)
            shares.append((name, _covered(tr.start[sel], tr.end[sel], edges) / width / len(ranks)))
        busy = sum(s for _, s in shares)
        shares.append(("idle", np.clip(1 - busy, 0, 1)))
        ax.stackplot(
            edges[:-1],
            [s for _, s in shares],
            colors=[COLORS[n] for n, _ in shares],
            step="post",
            lw=0,
        )
        pipes = len({result.devices[r].pipeline for r in ranks})
        busy_mean = np.mean([result.devices[r].busy_fraction for r in ranks])
        ax.set_ylabel(f"{gpu}\n{len(ranks)} dev, {pipes} pipes", fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_title(f"{gpu}: busy {busy_mean:.0%} on average", fontsize=8, loc="right")
    fig.suptitle(
        f"{title}  ({len(result.devices)} devices: share of each type's devices over time)",
        fontsize=10,
        x=0.01,
        ha="left",
    )
    axes[-1].set_xlabel("time (s)")
    axes[-1].set_xlim(0, result.iteration_time_s)
    names = [n for n in COLORS if n != "send/recv"]
    _legend(fig, names)
    return fig


def comparison_chart(entries: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Bar chart of throughput per strategy (the rows `hetpp compare --json` prints: strategy,
    feasible, throughput_samples_per_s, iteration_time_s). Infeasible strategies get an empty
    slot marked 'infeasible'; the best bar is labelled with its speed-up over the others."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [str(e["strategy"]) for e in entries]
    ok = [bool(e.get("feasible", True)) and e.get("throughput_samples_per_s") for e in entries]
    tput = [float(e["throughput_samples_per_s"]) if k else 0.0 for e, k in zip(entries, ok)]
    best = max(tput, default=0.0)
    fig = _figure(max(5.0, 1.1 * len(entries) + 2), 4)
    ax = fig.add_subplot()
    colors = ["#54A24B" if t == best and t > 0 else "#4C78A8" for t in tput]
    bars = ax.bar(names, tput, color=colors)
    for bar, e, k, t in zip(bars, entries, ok, tput):
        x = bar.get_x() + bar.get_width() / 2
        if not k:
            ax.text(x, best * 0.02, "infeasible", ha="center", va="bottom", rotation=90, fontsize=8)
            continue
        note = f"{t:.1f}/s\n{float(e['iteration_time_s']):.2f} s/step"
        if t < best:
            note += f"\n{best / t:.2f}x slower"
        ax.text(x, t, note, ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("throughput (samples/s)")
    ax.set_ylim(0, best * 1.3 if best > 0 else 1)
    ax.set_title("Throughput by strategy (same cluster, model and cost model)", fontsize=10)
    fig.savefig(path)
    return path


def predicted_vs_measured_chart(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Grouped bars of predicted and measured step time per strategy (rows with strategy,
    predicted_step_s, measured_step_s), each labelled with the prediction's relative error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [str(r["strategy"]) for r in rows]
    pred = np.array([float(r["predicted_step_s"]) for r in rows])
    meas = np.array([float(r["measured_step_s"]) for r in rows])
    x = np.arange(len(rows))
    fig = _figure(max(5.0, 1.3 * len(rows) + 2), 4)
    ax = fig.add_subplot()
    ax.bar(x - 0.2, pred, 0.4, label="predicted", color="#4C78A8")
    ax.bar(x + 0.2, meas, 0.4, label="measured", color="#F58518")
    for i in range(len(rows)):
        err = (pred[i] - meas[i]) / meas[i] if meas[i] > 0 else float("nan")
        ax.text(x[i], max(pred[i], meas[i]), f"{err:+.0%}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, names)
    ax.set_ylabel("step time (s)")
    top = float(max(pred.max(initial=0), meas.max(initial=0)))
    ax.set_ylim(0, top * 1.2 if top > 0 else 1)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title("Predicted vs measured step time (label: prediction error)", fontsize=10)
    fig.savefig(path)
    return path
