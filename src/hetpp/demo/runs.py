"""Train a plan with the real runtime (`hetpp train --emulate`) and read back what it measured.

Shared by `hetpp demo`, `bench/e2e.py` and `bench/emulation.py`. Each run is a subprocess (the
local launcher then starts one process per plan device), so a run starts from a clean slate and
this process never imports torch for it. No torch here.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetpp.runtime.metrics import StepMetrics, load_metrics, parse_record, summarize
from hetpp.specs.plan import Plan

OnStep = Callable[[StepMetrics], None]


class TrainFailed(RuntimeError):
    """A training run exited non-zero; the message ends with the tail of its log."""


def train_command(
    plan_path: Path, steps: int, metrics: Path, emulate: bool = True, data: Path | None = None
) -> list[str]:
    """The `hetpp train` command line of one run (its output goes to the run's log)."""
    args = ["train", "--plan", str(plan_path), "--steps", str(steps), "--metrics", str(metrics)]
    args += ["--timeout-s", "120"] + (["--emulate"] if emulate else [])
    args += ["--data", str(data)] if data is not None else []
    return [sys.executable, "-m", "hetpp.cli.main", *args]


def train_plan(
    plan: Plan,
    steps: int,
    work: Path,
    name: str = "run",
    on_step: OnStep | None = None,
    emulate: bool = True,
    data: Path | None = None,
) -> dict[str, Any]:
    """Train `plan` for `steps` steps; the measured summary (`hetpp.runtime.metrics.summarize`,
    the first step left out) plus `step_times_s`, every step's wall time.

    Files go to `work`: `{name}.json` (the plan), `{name}.jsonl` (per-step metrics) and
    `{name}.log` (the ranks' output). `on_step` is called once per finished step, as the metrics
    file grows, so a caller can show progress."""
    work.mkdir(parents=True, exist_ok=True)
    plan_path, metrics, log = work / f"{name}.json", work / f"{name}.jsonl", work / f"{name}.log"
    plan.save(plan_path)
    metrics.unlink(missing_ok=True)
    seen = 0
    with log.open("w") as out:
        proc = subprocess.Popen(
            train_command(plan_path, steps, metrics, emulate, data),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            while True:
                done = proc.poll() is not None
                seen = _report_new(metrics, seen, on_step)
                if done:
                    break
                time.sleep(0.2)
        except BaseException:  # Ctrl-C, or a failing callback: leave no ranks behind
            _stop(proc)
            raise
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise TrainFailed(f"`hetpp train` of {name} exited {proc.returncode}; {log}:\n{tail}")
    records = load_metrics(metrics)
    return {**summarize(records), "step_times_s": [r.step_s for r in records]}


def _stop(proc: subprocess.Popen) -> None:
    """Stop a `hetpp train` launcher and its ranks: SIGINT is a KeyboardInterrupt in the launcher,
    whose clean-up terminates the ranks (SIGTERM would end the launcher alone)."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _report_new(metrics: Path, seen: int, on_step: OnStep | None) -> int:
    """Call `on_step` for metrics lines past the first `seen`; the number of complete lines."""
    if not metrics.exists():
        return seen
    text = metrics.read_text()
    lines = text[: text.rfind("\n") + 1].splitlines()  # a line being written is not complete
    if on_step is not None:
        for line in lines[seen:]:
            on_step(parse_record(line))
    return len(lines)
