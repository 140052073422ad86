"""Plan one emulated cluster with every strategy, predict each plan, train some, set both side by
side: the machinery behind `hetpp demo` and `bench/e2e.py`. No torch here.

Predictions come from the simulator on a profile measured on this CPU and scaled per GPU type by
its emulation factor (`hetpp.demo.emulated`); measurements from `hetpp train --emulate`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hetpp.cost.step import cost_model_for_plan
from hetpp.demo.runs import OnStep, train_plan
from hetpp.planner import BASELINES, PlanResult, Problem, plan
from hetpp.planner.shapes import run_lengths
from hetpp.profile.table import ProfileTable
from hetpp.sim.replay import simulate_plan
from hetpp.sim.result import SimResult
from hetpp.specs.cluster import Cluster
from hetpp.specs.model import ModelConfig, ModelSpec
from hetpp.specs.plan import Plan
from hetpp.specs.trainspec import TrainSpec

WARMUP_STEPS = 2
"""Steps left out of the measured median: the first sets up the pipeline (shape inference,
communicator creation), the second still pays first-touch costs (measured:
docs/benchmarks-runtime-choices.md)."""


@dataclass(frozen=True)
class Setup:
    """What a comparison runs: an emulated cluster, a model and a batch."""

    cluster: Cluster
    model: ModelConfig
    seq_len: int = 128
    global_batch: int = 24
    """Divisible by 2, 3, 4 and 6, so equal-batch baselines are not refused by the batch size."""
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4)

    def problem(self, profiles: ProfileTable) -> Problem:
        """The planning problem, with the runtime's own training settings: float32 weights and
        gradients, AdamW (two float32 states), no memory reserve (the limits are the emulated
        types' own, tiny, memory sizes), no recomputation (the runtime has none)."""
        train = TrainSpec(
            global_batch=self.global_batch,
            seq_len=self.seq_len,
            precision="fp32",
            grad_bytes_per_param=4,
            optimizer_bytes_per_param=8,
            reserve_gb=0,
        )
        return Problem(
            model=ModelSpec(config=self.model, seq_len=self.seq_len, dtype_bytes=4),
            cluster=self.cluster,
            train=train,
            micro_batch_sizes=self.micro_batch_sizes,
            recompute_mode="off",
            profiles=profiles,
        )


@dataclass
class Candidate:
    """One strategy's plan and its prediction (and, once trained, what was measured)."""

    strategy: str
    result: PlanResult
    sim: SimResult | None = None
    measured: list[float] = field(default_factory=list)
    """Median step time of each training run of this plan."""
    step_times_s: list[list[float]] = field(default_factory=list)
    """Every step's wall time, per run."""

    @property
    def plan(self) -> Plan | None:
        return self.result.final_plan()

    @property
    def feasible(self) -> bool:
        return self.result.feasible

    @property
    def predicted_s(self) -> float:
        """Simulated step time (inf when there is no plan)."""
        return self.sim.iteration_time_s if self.sim is not None else float("inf")

    @property
    def measured_s(self) -> float | None:
        """Median over runs of the per-run median step time."""
        return statistics.median(self.measured) if self.measured else None

    @property
    def error(self) -> float | None:
        """Prediction error: predicted / measured - 1."""
        m = self.measured_s
        return self.predicted_s / m - 1 if m else None


def plan_all(
    problem: Problem, profiles: ProfileTable, strategies: tuple[str, ...] = ("hpp", *BASELINES)
) -> dict[str, Candidate]:
    """Every strategy's plan on the same problem, each simulated on the same profile."""
    out = {}
    for s in strategies:
        c = Candidate(s, plan(problem, s))
        if c.plan is not None:
            c.sim = simulate_plan(c.plan, cost_model_for_plan(c.plan, profiles))
        out[s] = c
    return out


def best_baseline(candidates: dict[str, Candidate]) -> str | None:
    """The feasible baseline with the shortest predicted step (highest predicted throughput)."""
    feasible = [c for s, c in candidates.items() if s in BASELINES and c.feasible]
    return min(feasible, key=lambda c: c.predicted_s).strategy if feasible else None


def measure(
    c: Candidate,
    steps: int,
    work: Path,
    tag: str = "",
    on_step: OnStep | None = None,
    data: Path | None = None,
) -> float:
    """Train the candidate's plan once; records and returns the run's median step time over the
    steps after `WARMUP_STEPS`."""
    if c.plan is None:
        raise ValueError(f"{c.strategy} has no plan to train")
    if steps <= WARMUP_STEPS:
        raise ValueError(f"need more than {WARMUP_STEPS} steps (the first are warm-up)")
    summary = train_plan(c.plan, steps, work, f"{c.strategy}{tag}", on_step, data=data)
    times = summary["step_times_s"]
    c.step_times_s.append(times)
    c.measured.append(statistics.median(times[WARMUP_STEPS:]))
    return c.measured[-1]


def interleaved(
    candidates: list[Candidate],
    steps: int,
    repeats: int,
    work: Path,
    on_run: Callable[[Candidate, int], OnStep | None] | None = None,
) -> None:
    """Train each candidate `repeats` times in round-robin order, so that a change in the
    machine's background load hits every strategy alike. `on_run(candidate, repeat)` may return a
    per-step callback for that run."""
    for r in range(repeats):
        for c in candidates:
            cb = on_run(c, r) if on_run is not None else None
            measure(c, steps, work, f"-{r}" if repeats > 1 else "", cb)


def describe(p: Plan) -> str:
    """Pipelines in a few words: each one's GPU types in device order and its batch share, e.g.
    `Fast×3 (19) + Slow×4 (5)` (a multi-chunk pipeline counts each device once)."""
    assert p.cluster is not None
    parts = []
    for pipe in p.pipelines:
        runs = run_lengths(p.cluster.gpu(d).name for d in pipe.devices)
        shape = "+".join(f"{g}×{n}" if n > 1 else g for g, n in runs)
        parts.append(f"{shape} ({pipe.batch})")
    return " + ".join(parts)
