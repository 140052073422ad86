"""Every strategy's plans are valid and fit; hpp beats the baselines and matches the oracle."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from planner_cases import cluster, problem, small_problems

import hetpp.planner.search as search
from hetpp.cost.step import step_cost
from hetpp.planner import STRATEGIES, Problem, plan
from hetpp.planner.feasibility import explain_infeasible
from hetpp.planner.oracle import search_oracle
from hetpp.specs import SpecError


def check_plan(p: Problem, r) -> None:
    """Valid plan, fits memory, batch conserved, estimate = full cost, self-describing."""
    plan_ = r.final_plan()
    plan_.validate_plan()
    p = p.on_unit(plan_.model.layer_unit)  # hpp's plans may end stages mid-block
    step = step_cost(plan_, p.cost_model(plan_.train.recompute))
    assert step.fits
    assert sum(x.batch for x in plan_.pipelines) == p.global_batch
    assert step.iteration_time_s == pytest.approx(r.iteration_time_s)
    assert plan_.estimate.iteration_time_s == pytest.approx(step.iteration_time_s)
    assert plan_.model == p.model.config and plan_.cluster == p.cluster
    assert plan_.strategy == r.strategy
    if p.recompute_mode != "auto":
        assert plan_.train.recompute == (p.recompute_mode == "on")


@given(small_problems())
@settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
def test_every_plan_is_valid_and_hpp_is_best_and_matches_the_oracle(p):
    results = {s: plan(p, s) for s in STRATEGIES}
    for r in results.values():
        if r.feasible:
            check_plan(p, r)
    hpp = results["hpp"]
    # The oracle enumerates the one-chunk space (both end with the same schedule pass over their
    # fastest plans, which is no enumeration): compared there.
    # hpp's two last passes leave the oracle's space (one micro-batch size per plan, DP
    # splits): `mixed_mbs` (a size per pipeline) and `resplit` (cuts moved under the full
    # step cost), and so does the half-block pass after them. The oracle bounds hpp from above
    # without them.
    one = replace(p, schedules=())
    hpp_one, oracle = plan(one, "hpp"), plan(one, "oracle")
    one = replace(one, half_blocks=False)
    with (
        mock.patch.object(search, "resplit_if_faster", lambda _, plan, step: (plan, step)),
        mock.patch.object(search, "mix_micro_batch_sizes", lambda _p, _w, plan, step: (plan, step)),
    ):
        hpp_dp = plan(one, "hpp")
    assert hpp.feasible == oracle.feasible == hpp_one.feasible == hpp_dp.feasible
    for name in ("uniform", "layer-balanced", "data-balanced"):
        if results[name].feasible:
            assert hpp.iteration_time_s <= results[name].iteration_time_s * (1 + 1e-9)
    if hpp.feasible:
        assert hpp_one.iteration_time_s <= hpp_dp.iteration_time_s * (1 + 1e-12)
        assert hpp_dp.iteration_time_s <= oracle.iteration_time_s * 1.01
        assert oracle.iteration_time_s <= hpp_dp.iteration_time_s * 1.01
        assert hpp.iteration_time_s <= hpp_one.iteration_time_s * (1 + 1e-9)
    elif p.batch_sizes():
        assert explain_infeasible(p)  # says why


def test_hpp_plan_on_a_mixed_cluster_uses_both_types_and_reports_unused():
    p = problem(cluster(("A100-80GB", 4, 1), ("RTX-4090", 4, 1)), "gpt3-1.3b", 64, seq=2048)
    r = plan(p, "hpp")
    check_plan(p, r)
    used = {p.cluster.gpu(d).name for pipe in r.plan.pipelines for d in pipe.devices}
    assert used == {"A100-80GB", "RTX-4090"}
    assert r.search_time_s > 0 and r.final_plan().estimate.search_time_s == r.search_time_s


def test_recompute_modes():
    p = problem(cluster(("V100-16GB", 4, 1)), "gpt3-1.3b", 16, seq=2048, recompute_mode="on")
    assert plan(p, "hpp").plan.train.recompute is True
    p = problem(cluster(("V100-16GB", 4, 1)), "gpt3-1.3b", 16, seq=2048, recompute_mode="off")
    r = plan(p, "hpp")
    assert r.plan.train.recompute is False
    check_plan(p, r)


def test_infeasible_model_says_what_does_not_fit():
    p = problem(cluster(("RTX-4090", 2, 1)), "llama2-13b", 64, seq=2048)
    r = plan(p, "hpp")
    assert not r.feasible
    msg = explain_infeasible(p)
    assert "llama2-13b needs at least 234 GB" in msg and "44 GB" in msg
    p = problem(cluster(("A100-80GB", 4, 1)), "llama2-13b", 6, seq=2048, micro_batch_sizes=(4,))
    assert "not a multiple" in explain_infeasible(p)
    p = problem(cluster(("A100-80GB", 8, 1)), "llama2-13b", 2, seq=2048)
    assert not plan(p, "hpp").feasible
    assert "global batch 2 is too small" in explain_infeasible(p)


def test_oracle_refuses_large_clusters():
    p = problem(cluster(("A100-80GB", 8, 2)), "gpt3-350m", 32)
    with pytest.raises(SpecError, match="at most 8 devices"):
        search_oracle(p)


@pytest.mark.parametrize(
    "groups, model, batch",
    [
        ((("H100-80GB", 4, 1), ("T4", 4, 3)), "gpt3-13b", 128),
        ((("A100-80GB", 4, 2), ("RTX-4090", 4, 2)), "llama2-7b", 128),
        # Two different mixed shapes (4 A100 + 3 L40S, 4 + 5) beat two identical ones by 4%:
        # reached by local moves (`planner.refine`) once buckets of one type sync inside a node.
        ((("L40S", 8, 1), ("A100-80GB", 8, 1)), "gpt3-13b", 128),
    ],
)
def test_decomposed_search_is_close_to_exact_on_medium_clusters(monkeypatch, groups, model, batch):
    """The large-cluster search (per-type knapsack, one mixed template, nested layouts) against
    the exact one (every template multiset) on clusters where both run."""
    p = problem(cluster(*groups), model, batch, seq=2048)
    monkeypatch.setattr(search, "EXACT_STATES", 10**6)
    exact = plan(p, "hpp")
    monkeypatch.setattr(search, "EXACT_STATES", 0)
    decomposed = plan(problem(cluster(*groups), model, batch, seq=2048), "hpp")
    gap = decomposed.iteration_time_s / exact.iteration_time_s - 1
    print(f"{model} {groups}: decomposed {gap:+.2%} against exact")
    assert gap <= 0.03
