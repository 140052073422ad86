"""The demo machinery without training: built-in cluster, scaled profiles, planning and simulation
of every strategy, choice of the baseline, the result table, reading a growing metrics file."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from hetpp.demo.compare import (
    BASELINES,
    Candidate,
    Setup,
    best_baseline,
    describe,
    interleaved,
    plan_all,
)
from hetpp.demo.emulated import CPU, builtin_cluster, emulated_profiles, type_factors
from hetpp.demo.report import markdown_table, results_table
from hetpp.demo.runs import _report_new
from hetpp.profile.table import ProfileRow, ProfileTable
from hetpp.specs import PRESETS
from hetpp.specs.model import ModelSpec

SEQ = 128
BLOCK_FWD_S = {1: 0.0035, 2: 0.006, 4: 0.011}
"""Synthetic CPU forward seconds of one gpt-demo block (about what a laptop core takes)."""


def synthetic_cpu_profile() -> ProfileTable:
    """A CPU profile of gpt-demo shaped like a measured one: backward twice forward, embedding
    and head cheap, kept bytes as the model spec counts them."""
    layers = ModelSpec(config=PRESETS["gpt-demo"], seq_len=SEQ, dtype_bytes=4).layers
    by_kind = {x.kind: x for x in layers}
    share = {"embedding": 0.05, "block": 1.0, "head": 0.2}
    return ProfileTable(
        ProfileRow(
            CPU,
            "gpt-demo",
            SEQ,
            kind,
            mbs,
            f * share[kind],
            2 * f * share[kind],
            by_kind[kind].saved_bytes_per_sample * mbs,
        )
        for kind in share
        for mbs, f in BLOCK_FWD_S.items()
    )


@pytest.fixture(scope="module")
def planned():
    cluster = builtin_cluster()
    profiles = emulated_profiles(synthetic_cpu_profile(), cluster)
    setup = Setup(cluster, PRESETS["gpt-demo"], seq_len=SEQ)
    return setup, profiles, plan_all(setup.problem(profiles), profiles)


def test_builtin_cluster_is_fast_and_slow_types_with_little_memory():
    cluster = builtin_cluster()
    factors = type_factors(cluster)
    assert factors == {"Fast": 4.0, "Slow": 16.0}
    model = ModelSpec(config=PRESETS["gpt-demo"], seq_len=SEQ, dtype_bytes=4)
    states = model.total_params * 16  # float32 weights and grads, two AdamW states
    for gpu in ("fast", "slow"):
        assert cluster.type_table[gpu].memory_bytes < states  # no device holds the model alone


def test_profiles_are_the_cpu_rows_scaled_per_type():
    cpu = synthetic_cpu_profile()
    scaled = emulated_profiles(cpu, builtin_cluster())
    assert scaled.gpus() == {"fast", "slow"}
    f_cpu, b_cpu, act = cpu.lookup(CPU, "block", 2)
    assert scaled.lookup("Fast", "block", 2) == pytest.approx((4 * f_cpu, 4 * b_cpu, act))
    assert scaled.lookup("Slow", "block", 2) == pytest.approx((16 * f_cpu, 16 * b_cpu, act))


def test_every_strategy_is_planned_and_simulated_within_memory(planned):
    setup, _, cands = planned
    assert list(cands) == ["hpp", *BASELINES]
    hpp = cands["hpp"]
    assert hpp.feasible and hpp.sim is not None
    for c in cands.values():
        if not c.feasible:
            continue
        assert c.plan.global_batch == setup.global_batch
        assert all(d.fits for d in c.sim.devices), c.strategy  # memory shaped the plan
        # the planner ranks by the closed form, the demo predicts with the simulator: they agree
        assert c.predicted_s == pytest.approx(c.result.iteration_time_s, rel=0.1)
        assert hpp.result.iteration_time_s <= c.result.iteration_time_s * (1 + 1e-9)


def test_the_best_baseline_is_the_fastest_feasible_one(planned):
    _, _, cands = planned
    base = best_baseline(cands)
    feasible = [c for s, c in cands.items() if s in BASELINES and c.feasible]
    assert base == min(feasible, key=lambda c: c.predicted_s).strategy
    assert best_baseline({"hpp": cands["hpp"]}) is None


def test_describe_names_types_in_stage_order_and_batch_shares(planned):
    _, _, cands = planned
    plan = cands["hpp"].plan
    text = describe(plan)
    assert text.count("(") == len(plan.pipelines)
    assert sum(int(part.split("(")[1].rstrip(")")) for part in text.split(" + ")) == 24


def test_table_shows_measured_speed_up_and_prediction_error(planned):
    _, _, cands = planned
    hpp, base = cands["hpp"], cands[best_baseline(cands)]
    hpp.measured, base.measured = [2.0], [3.0]
    try:
        md = markdown_table(list(cands.values()), 24)
        row = next(line for line in md.splitlines() if line.startswith(f"| {base.strategy} "))
        pred = f"{base.predicted_s / hpp.predicted_s:.2f}x"
        assert row.endswith(f"| {base.predicted_s / 3.0 - 1:+.0%} | 8.0 | 1.50x | {pred} |")
        assert md.splitlines()[2].endswith(
            f"| 2.00 | {hpp.predicted_s / 2.0 - 1:+.0%} | 12.0 |  |  |"
        )
        console = Console(width=80, record=True)
        console.print(results_table(list(cands.values()), 24, "t"))
        text = console.export_text()
        assert "1.50x" in text and pred in text and "speed-up" in text  # fits 80 columns
    finally:
        hpp.measured, base.measured = [], []


def test_candidate_without_measurement_has_no_error():
    c = Candidate("x", result=None)  # type: ignore[arg-type]
    assert c.measured_s is None and c.error is None


def test_a_line_being_written_is_not_reported(tmp_path):
    record = {
        "step": 1, "loss": 5.5, "step_s": 2.0, "samples_per_s": 12.0, "tokens_per_s": 1536.0,
        "grad_norm": None, "compute_s": [1.0], "wait_s": [0.5], "comm_s": [0.1],
    }  # fmt: skip
    path = tmp_path / "m.jsonl"
    seen: list[int] = []
    assert _report_new(path, 0, lambda m: seen.append(m.step)) == 0  # no file yet
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "step": 2})[:20])
    assert _report_new(path, 0, lambda m: seen.append(m.step)) == 1
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "step": 2}) + "\n")
    assert _report_new(path, 1, lambda m: seen.append(m.step)) == 2
    assert seen == [1, 2]


def test_runs_are_interleaved_and_timed_after_warm_up(planned, monkeypatch, tmp_path):
    _, _, cands = planned
    order: list[str] = []

    def fake_train(plan, steps, work, name, on_step=None, data=None):
        order.append(name)
        times = [9.0, 8.0] + [1.0 + 0.1 * k for k in range(steps - 2)]  # two slow warm-up steps
        return {"step_times_s": times}

    monkeypatch.setattr("hetpp.demo.compare.train_plan", fake_train)
    two = [cands["hpp"], cands[best_baseline(cands)]]
    try:
        interleaved(two, steps=5, repeats=2, work=tmp_path)
        assert order == [f"{c.strategy}-{r}" for r in range(2) for c in two]
        assert two[0].measured == [1.1, 1.1]  # median of 1.0, 1.1, 1.2: warm-up left out
        assert len(two[1].step_times_s) == 2
    finally:
        for c in two:
            c.measured, c.step_times_s = [], []


def test_demo_refuses_too_few_steps_before_doing_anything(tmp_path, capsys):
    from hetpp.cli.main import main

    assert main(["demo", "--steps", "2", "--out", str(tmp_path / "d")]) == 2
    assert "--steps: must be more than 2" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
