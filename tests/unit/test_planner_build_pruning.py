"""`variants.build_scheduled` rules its trials out with `assemble.evaluate_below` (memory, then
the slowest pipeline against the best trial so far) before their full cost: it must build what
it built when every trial was costed in full."""

from __future__ import annotations

from planner_cases import cluster, problem

import hetpp.planner.search as search
import hetpp.planner.variants as variants
from hetpp.planner import plan
from hetpp.planner.assemble import evaluate


def test_build_scheduled_builds_what_full_costs_would_build(monkeypatch):
    # 4 A100 + 4 RTX-4090 (gpt3-1.3b, batch 64) takes the two-type chunk-aware count DP, whose
    # answers are built on their schedules: some trials overfill, some are slower
    p = problem(cluster(("A100-80GB", 4, 1), ("RTX-4090", 4, 1)), "gpt3-1.3b", 64, seq=2048)
    calls, pruned = [], []
    build, below = variants.build_scheduled, variants.evaluate_below

    def recorded(ctx, chosen, *rest):
        got = build(ctx, chosen, *rest)
        calls.append((ctx, chosen, got))
        return got

    def counted(problem, cand, bound_s):
        got = below(problem, cand, bound_s)
        pruned.append(got is None)
        return got

    monkeypatch.setattr(search, "build_scheduled", recorded)
    monkeypatch.setattr(variants, "evaluate_below", counted)
    plan(p, "hpp")
    assert any(got is not None for *_, got in calls) and any(pruned) and not all(pruned)
    # the same builds with every trial costed in full
    monkeypatch.setattr(
        variants, "evaluate_below", lambda problem, cand, _: evaluate(problem, cand)
    )
    for ctx, chosen, got in calls:
        full = build(ctx, chosen)
        assert (got is None) == (full is None)
        if got is not None:
            assert got.plan == full.plan and got.iteration_time_s == full.iteration_time_s
