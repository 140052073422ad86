"""The search's exact pruning: what it skips could not have been kept.

`assemble.evaluate_below` returns None for a plan without timing it where memory alone says it
does not fit (`cost.step.plan_fits`), or where its slowest pipeline already reaches the bound.
Both must agree with the full cost on every plan: `plan_fits` is `step_cost(...).fits`, and a
plan it lets through costs what `evaluate` says."""

from __future__ import annotations

from pathlib import Path

import pytest
from planner_cases import problem

from hetpp.cost.step import plan_fits, step_cost
from hetpp.planner import plan
from hetpp.planner.assemble import evaluate, evaluate_below
from hetpp.planner.schedules import _chunked, _with_pipeline
from hetpp.specs import load_cluster
from hetpp.specs.schedule import SCHEDULES

MIXED8 = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "mixed-8.yaml"
CHUNKED = tuple(n for n, s in SCHEDULES.items() if s.placement != "one")


@pytest.fixture(scope="module")
def trials():
    """hpp's one-chunk plan on 4 A100s + 4 RTX 4090s (gpt3-1.3b, batch 64) and each of its
    pipelines moved alone to every multi-chunk schedule at 2 chunks, both device orders, at
    its own micro-batch size and at 4x it (more activations: some stop fitting)."""
    cl = load_cluster(MIXED8)
    base = plan(problem(cl, "gpt3-1.3b", 64, seq=2048, schedules=()), "hpp").plan
    prob = problem(cl, "gpt3-1.3b", 64, seq=2048, schedules=CHUNKED)
    out = [base]
    for i, pipe in enumerate(base.pipelines):
        for name in CHUNKED:
            for flip in (False, True):
                got = _chunked(prob, base, pipe, SCHEDULES[name], 2, "balanced", flip)
                if got is not None:
                    out.append(_with_pipeline(base, i, got))
    bigger = []
    for p in out:
        pipes = tuple(
            x.model_copy(update={"micro_batch_size": 4 * x.micro_batch_size}) for x in p.pipelines
        )
        bigger.append(p.model_copy(update={"pipelines": pipes, "grad_blocks": None}))
    return prob, out + bigger


def test_plan_fits_is_the_full_costs_fits(trials):
    prob, plans = trials
    cm = prob.cost_model(False, shards=1)
    verdicts = [plan_fits(p, cm) for p in plans]
    assert verdicts == [step_cost(p, cm).fits for p in plans]
    assert any(verdicts) and not all(verdicts)  # both kinds are tested
    assert any(p.pipelines[i].chunks > 1 for p in plans for i in range(len(p.pipelines)))


def test_evaluate_below_skips_only_what_could_not_be_kept(trials):
    prob, plans = trials
    full = [evaluate(prob, p) for p in plans]
    times = sorted(s.iteration_time_s for s in full if s.fits)
    for bound in (float("inf"), times[len(times) // 2], times[0]):
        for p, s in zip(plans, full):
            got = evaluate_below(prob, p, bound)
            kept = s.fits and s.iteration_time_s < bound
            if got is None:
                assert not kept
            else:
                assert got.iteration_time_s == s.iteration_time_s and got.fits == s.fits
