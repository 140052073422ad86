"""`hetpp demo`: the whole job on a built-in emulated cluster, in a few minutes on a laptop CPU.

1. Profile the demo model on this CPU (one thread, as each rank runs), scale it per GPU type.
2. Plan with hpp and every baseline; simulate each plan (the prediction).
3. Train hpp and the best baseline (or all) with the real runtime under `--emulate`.
4. Print predicted against measured; write Gantt charts and a predicted-vs-measured chart.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hetpp.demo.compare import WARMUP_STEPS, Candidate, Setup, best_baseline, describe, plan_all
from hetpp.demo.compare import measure as measure_candidate
from hetpp.demo.corpus import build_corpus
from hetpp.demo.emulated import builtin_cluster, emulated_profiles, profile_cpu, type_factors
from hetpp.demo.report import plans_table, results_table, write_charts
from hetpp.profile.table import ProfileTable
from hetpp.report.inputs import cluster_table
from hetpp.specs.presets import PRESETS

MODEL = "gpt-demo"

CORPUS_BYTES = 1_000_000
"""Standard-library source the demo trains on (tokenizer and dataset built in seconds)."""


@dataclass(frozen=True)
class DemoOptions:
    out: Path = Path("hetpp-demo")
    steps: int = 7
    """Training steps per plan; the first WARMUP_STEPS are not timed."""
    train_all: bool = False
    """Train every feasible baseline, not only the best predicted one."""


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def profile(setup: Setup, console: Console) -> ProfileTable:
    """This CPU's profile of the demo model, with a progress bar (a few seconds)."""
    mbs = list(setup.micro_batch_sizes)
    with _progress(console) as bar:
        task = bar.add_task(
            f"profiling {setup.model.name} on this CPU (1 thread)", total=3 * len(mbs)
        )
        cpu = profile_cpu(setup.model, setup.seq_len, mbs, on_row=lambda _: bar.advance(task))
    return cpu


def train(
    cands: list[Candidate], steps: int, work: Path, console: Console, data: Path | None = None
) -> None:
    """Train each candidate once (on `data`), one progress bar per run."""
    with _progress(console) as bar:
        for c in cands:
            assert c.plan is not None
            task = bar.add_task(f"training {c.strategy}: {describe(c.plan)}", total=steps)
            advance = lambda _m, t=task: bar.advance(t)  # noqa: E731
            measure_candidate(c, steps, work, on_step=advance, data=data)


def run_demo(opts: DemoOptions, console: Console) -> int:
    """The whole demo; 0 on success, 1 if hpp finds no plan."""
    t0 = time.perf_counter()
    cluster = builtin_cluster()
    setup = Setup(cluster, PRESETS[MODEL])
    _intro(setup, console)
    opts.out.mkdir(parents=True, exist_ok=True)
    cpu = profile(setup, console)
    cpu.save(opts.out / "cpu-profile.csv")  # for inspection; never read back
    profiles = emulated_profiles(cpu, cluster)
    with console.status("planning with hpp and the baselines; simulating each plan"):
        cands = plan_all(setup.problem(profiles), profiles)
    console.print(plans_table(list(cands.values())))
    hpp, base = cands["hpp"], best_baseline(cands)
    if not hpp.feasible:
        console.print(f"[red]hpp found no plan: {hpp.result.note}[/]")
        return 1
    chosen = [
        c
        for c in cands.values()
        if c.feasible and (opts.train_all or c is hpp or c.strategy == base)
    ]
    console.print(
        f"Best baseline by predicted throughput: {base}. Training "
        f"{', '.join(c.strategy for c in chosen)} for {opts.steps} steps each (the first "
        f"{WARMUP_STEPS} are warm-up) with `hetpp train --emulate`."
    )
    with console.status("preparing real text: the Python standard library's sources, a BPE"):
        data = build_corpus(opts.out / "corpus", limit_bytes=CORPUS_BYTES)
    train(chosen, opts.steps, opts.out / "runs", console, data)
    with console.status("drawing charts"):
        charts = write_charts(chosen, opts.out, MODEL)
    console.print(results_table(list(cands.values()), setup.global_batch, "Predicted and measured"))
    _conclusion(hpp, cands.get(base) if base else None, console)
    _save(cands, opts.out / "results.json")
    console.print("Charts: " + ", ".join(str(p) for p in charts))
    console.print(f"Plans, per-step metrics and logs: {opts.out / 'runs'}")
    console.print(f"Done in {time.perf_counter() - t0:.0f} s.")
    return 0


def _intro(setup: Setup, console: Console) -> None:
    console.rule("hetpp demo: a mixed cluster, the plan hpp finds, the plans others would use")
    factors = type_factors(setup.cluster)
    console.print(cluster_table(setup.cluster, factors, title="Emulated cluster"))
    c = setup.model
    console.print(
        f"Model {c.name} ({c.num_layers} blocks, hidden {c.hidden_size}; layer 0 is the "
        f"embedding, {c.num_layers + 1} the head), sequence {setup.seq_len}, global batch "
        f"{setup.global_batch}, float32, AdamW. Each device is a CPU process that sleeps within "
        "every forward and backward until it has taken its type's factor times the CPU time. "
        "Memory is not enforced on CPU: the sizes above shape the plans (every stage must fit "
        "its device), the runs do not check them.\n"
    )


def _conclusion(hpp: Candidate, base: Candidate | None, console: Console) -> None:
    if base is None or base.measured_s is None or hpp.measured_s is None:
        console.print(
            "No baseline could be trained on this cluster: hpp is the only plan that fits."
        )
        return
    console.print(
        f"[bold]hpp trains {base.measured_s / hpp.measured_s:.2f}x faster than {base.strategy}[/] "
        f"(predicted {base.predicted_s / hpp.predicted_s:.2f}x); prediction error "
        f"{hpp.error:+.0%} (hpp), {base.error:+.0%} ({base.strategy})."
    )


def _save(cands: dict[str, Candidate], path: Path) -> None:
    """Predicted and measured figures of every strategy, for scripts."""
    rows = [
        {
            "strategy": s,
            "feasible": c.feasible,
            "pipelines": describe(c.plan) if c.plan else None,
            "predicted_step_s": c.predicted_s if c.feasible else None,
            "measured_step_s": c.measured_s,
            "step_times_s": c.step_times_s,
        }
        for s, c in cands.items()
    ]
    path.write_text(json.dumps(rows, indent=1) + "\n")
