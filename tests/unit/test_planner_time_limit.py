"""`plan(..., time_limit_s)` under `hetpp plan`'s default sharding (`targeted`): the best plan
so far, the sharded schedule passes skipped once the limit has passed, and the note says so."""

from __future__ import annotations

from planner_cases import cluster, problem

from hetpp.planner import plan

SKIPPED = "sharded schedule passes skipped"


def test_targeted_sharding_stops_at_the_time_limit():
    cl = cluster(("A100-40GB", 2, 2), ("A100-80GB", 2, 1))
    cut = plan(problem(cl, "gpt3-1.3b", 16, sharding_mode="targeted"), "best", None, 1e-9)
    assert cut.feasible and cut.plan.sharding == "none"
    assert cut.note.startswith("time limit of 1e-09 s reached") and SKIPPED in cut.note
    # what the unsharded search found by then, unchanged
    none = plan(problem(cl, "gpt3-1.3b", 16, sharding_mode="none"), "best", None, 1e-9)
    assert cut.plan == none.plan and cut.iteration_time_s == none.iteration_time_s
    full = plan(problem(cl, "gpt3-1.3b", 16, sharding_mode="targeted"), "best", None, 1000.0)
    assert SKIPPED not in full.note and "time limit" not in full.note
    # a longer search can end slower: the last passes (`search.with_last_passes`) run on
    # its leading plans only, and the cut search's plan, from the uniform baseline, re-splits
    # to a V split 0.6% faster than the one the full search's plan reaches (0.19252 s against
    # 0.19372 s)
    assert full.iteration_time_s <= cut.iteration_time_s * (1 + 0.01)
