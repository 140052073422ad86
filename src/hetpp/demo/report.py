"""How a comparison is shown: the rich table, a markdown table, the charts. No torch here."""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.table import Table

from hetpp.demo.compare import Candidate, describe

RESULT_COLUMNS = (
    "strategy",
    "predicted\ns/step",
    "measured\ns/step",
    "error",
    "samples\nper s",
    "speed-up\nmeasured",
    "speed-up\npredicted",
)
"""Headings of the result table; a newline is where a narrow terminal may break one."""
CAPTION = (
    "measured: median step after warm-up; error: predicted / measured - 1; "
    "speed-up: this plan's step time / hpp's (how much faster hpp is)"
)


def _result_cells(c: Candidate, hpp: Candidate, batch: int) -> list[str]:
    if c.plan is None:
        return [c.strategy, *["-"] * 6]  # the plans table says why
    m, h = c.measured_s, hpp.measured_s
    return [
        c.strategy,
        f"{c.predicted_s:.2f}",
        f"{m:.2f}" if m is not None else "-",
        f"{c.error:+.0%}" if c.error is not None else "-",
        f"{batch / m:.1f}" if m is not None else "-",
        "" if c is hpp else f"{m / h:.2f}x" if m is not None and h is not None else "-",
        "" if c is hpp else f"{c.predicted_s / hpp.predicted_s:.2f}x",
    ]


def results_table(cands: list[Candidate], batch: int, title: str) -> Table:
    """One row per strategy, hpp first: predicted and measured step time (median over runs of
    each run's median after warm-up), measured throughput, hpp's speed-up."""
    hpp = next(c for c in cands if c.strategy == "hpp")
    t = Table(
        title=title, caption=CAPTION, title_justify="left", caption_justify="left",
        box=box.SIMPLE_HEAD, pad_edge=False,
    )  # fmt: skip
    for col in RESULT_COLUMNS:
        t.add_column(
            col,
            justify="left" if col == "strategy" else "right",
            no_wrap=True,
            min_width=max(map(len, col.split("\n"))),
        )
    for c in cands:
        t.add_row(*_result_cells(c, hpp, batch), style="bold" if c is hpp else None)
    return t


def plans_table(cands: list[Candidate]) -> Table:
    """What each strategy runs: per pipeline its stages (GPU type and layer range, layer 0 the
    embedding, the last the head) and its share of the batch."""
    t = Table(title="Plans", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("strategy", "pipeline: stages (GPU type layers)", "samples"):
        t.add_column(col, justify="right" if col == "samples" else "left")
    for c in cands:
        if c.plan is None:
            t.add_row(c.strategy, c.result.note or "no plan fits", "")
            continue
        for i, pipe in enumerate(c.plan.pipelines):
            stages = "  ".join(
                f"{c.plan.cluster.gpu(st.device).name} {st.layers[0]}-{st.layers[1]}"
                for st in pipe.stages
            )
            t.add_row(c.strategy if i == 0 else "", stages, str(pipe.batch))
        t.add_section()
    return t


def markdown_table(cands: list[Candidate], batch: int) -> str:
    """The result table with a column of pipelines (`describe`), as markdown."""
    hpp = next(c for c in cands if c.strategy == "hpp")
    head = [col.replace("\n", " ") for col in RESULT_COLUMNS]
    head.insert(1, "pipelines: GPU types (samples)")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cands:
        cells = _result_cells(c, hpp, batch)
        cells.insert(1, describe(c.plan) if c.plan else "no plan fits")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def write_charts(trained: list[Candidate], out: Path, model: str) -> list[Path]:
    """A Gantt chart of each trained plan's simulated step, and predicted vs measured step time."""
    from hetpp.report.charts import gantt_chart, predicted_vs_measured_chart

    paths = []
    for c in trained:
        assert c.sim is not None
        title = f"{model}, {c.strategy} plan (simulated)"
        paths.append(gantt_chart(c.sim, out / f"gantt-{c.strategy}.png", title=title))
    rows = [
        {"strategy": c.strategy, "predicted_step_s": c.predicted_s, "measured_step_s": c.measured_s}
        for c in trained
        if c.measured_s is not None
    ]
    paths.append(predicted_vs_measured_chart(rows, out / "predicted-vs-measured.png"))
    return paths
