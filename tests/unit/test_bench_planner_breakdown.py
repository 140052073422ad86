"""`bench/planner.py`'s breakdown of hpp's step against the physical limit."""

from __future__ import annotations

import pytest
from bench_modules import load_bench
from planner_cases import cluster, problem

from hetpp.planner import physical_limit_samples_per_s, plan
from hetpp.planner.assemble import PlanResult, evaluate
from hetpp.specs.plan import PipelinePlan, Plan, StagePlan


@pytest.fixture(scope="module")
def bench():
    return load_bench("planner")


def test_the_shares_add_up_to_the_step_and_start_with_the_fraction_of_the_limit(bench):
    p = problem(cluster(("A100-80GB", 4, 1), ("RTX-4090", 4, 1)), "gpt3-1.3b", 32, schedules=())
    r = plan(p, "hpp")
    limit = physical_limit_samples_per_s(p)
    got = bench.step_breakdown(p, r, limit)
    assert set(got) == {"limit", *bench.LOSSES}
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-9)
    assert got["limit"] == pytest.approx(r.throughput_samples_per_s / limit, rel=1e-12)
    for k in ("bubble", "sync", "optimizer", "efficiency"):
        assert got[k] >= -1e-12, k


def _two_a100s(p) -> Plan:
    """Devices 0 and 1 as one 1F1B pipeline, 26 layers cut 13/13, 8 micro-batches of 1."""
    stages = (StagePlan(devices=(0,), layers=(0, 13)), StagePlan(devices=(1,), layers=(13, 26)))
    return Plan(
        pipelines=(PipelinePlan(stages=stages, micro_batch_size=1, num_micro_batches=8),),
        strategy="hand",
        **p.plan_fields(False),
    )


def test_one_1f1b_pipeline_of_two_equal_stages(bench):
    """Two A100s, 26 layers cut 13/13 at micro-batch 1, 8 micro-batches: the bubble is the
    pipeline's time beyond 8 x the busier stage's work; the only sync is the tied embedding and
    head's, between the two."""
    p = problem(cluster(("A100-80GB", 2, 1)), "gpt3-1.3b", 8, schedules=())
    pl = _two_a100s(p)
    step = evaluate(p, pl)
    got = bench.step_breakdown(p, PlanResult("hand", pl, step), physical_limit_samples_per_s(p))
    work = max(s.fwd_s + s.bwd_s for s in step.stages)
    total = step.iteration_time_s
    assert got["bubble"] == pytest.approx((step.pipeline_time_s[0] - 8 * work) / total)
    assert got["bubble"] > 0
    assert got["sync"] == pytest.approx(step.exposed_sync_s / total)
    assert got["imbalance"] >= 0
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-9)


def test_sharding_reaches_every_strategy_and_the_setting_names_it(bench, monkeypatch):
    """`--sharding auto` plans every strategy on a problem that may shard; the table's setting
    says when a plan does."""
    seen = []

    def fake_plan(problem, name):
        seen.append((name, problem.sharding_mode))
        return PlanResult(name, None, None)

    monkeypatch.setattr(bench, "plan", fake_plan)
    rows = []
    monkeypatch.setattr(bench, "print_row", rows.append)
    first = bench.scenarios(True)[0]
    monkeypatch.setattr(bench, "scenarios", lambda quick: [first])
    bench.main(["--sharding", "auto", "--no-oracle"])
    assert [m for _, m in seen] == ["auto"] * 4 and rows[0]["hpp"]["tput"] == 0
    p = problem(cluster(("A100-80GB", 4, 1)), "gpt3-1.3b", 32, schedules=())
    r = plan(p, "hpp")
    assert bench._setting(r.plan).endswith("no recompute")
    sharded = r.plan.model_copy(update={"sharding": "optimizer"})
    assert bench._setting(sharded).endswith("no recompute, sharding optimizer")


def test_devices_the_plan_leaves_idle_are_unused_not_mbs_or_imbalance(bench):
    """Three A100s, a plan on two of them: the third's share of the limit is `unused` (half
    the step at the limit's rate), and the mbs/recompute share counts only the two it uses."""
    p = problem(cluster(("A100-80GB", 3, 1)), "gpt3-1.3b", 8, schedules=())
    pl = _two_a100s(p)
    step = evaluate(p, pl)
    limit = physical_limit_samples_per_s(p)
    assert physical_limit_samples_per_s(p, {0, 1}) == pytest.approx(limit * 2 / 3, rel=1e-12)
    got = bench.step_breakdown(p, PlanResult("hand", pl, step), limit)
    assert got["unused"] == pytest.approx(got["limit"] / 2, rel=1e-9)
    on_two = bench.step_breakdown(
        problem(cluster(("A100-80GB", 2, 1)), "gpt3-1.3b", 8, schedules=()),
        PlanResult("hand", pl, step),
        limit * 2 / 3,
    )
    assert on_two["unused"] == pytest.approx(0.0, abs=1e-12)
    assert got["efficiency"] == pytest.approx(on_two["efficiency"], rel=1e-9)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-9)


def test_only_runs_the_scenarios_named(bench, monkeypatch):
    seen = []

    def fake_plan(problem, name):
        seen.append((problem.cluster.name, problem.model.name))
        return PlanResult(name, None, None)

    monkeypatch.setattr(bench, "plan", fake_plan)
    monkeypatch.setattr(bench, "print_row", lambda row: None)
    bench.main(["--only", "gen-16:llama2-7b", "mixed-8", "--no-oracle"])
    got = sorted(set(seen))
    assert [m for c, m in got if c.startswith("gen")] == ["llama2-7b"]
    assert len([c for c, _ in got if not c.startswith("gen")]) == 3  # mixed-8's three models
    with pytest.raises(SystemExit):
        bench.main(["--only", "no-such-cluster"])
