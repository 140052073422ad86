"""Oracle: every plan of hpp's space, for testing the search on small clusters.

It enumerates every multiset of pipeline templates that fits the cluster (every device-count
vector, every stage order of its type runs, any number of copies, devices left idle), for every
micro-batch size and recomputation setting, plus the baselines' plans; its fastest plans then get
the schedule pass as hpp's do (`search.after_schedule_pass`). Each multiset gets the
same placement and data balance as `hpp` and is ranked by the full step cost. Branch and bound
(`multisets`) keeps that affordable without changing the answer: multisets are visited in order
of a lower bound on their step cost, and the walk stops when it reaches the best cost found.
"""

from __future__ import annotations

import time
from functools import partial

from hetpp.planner.assemble import Incumbent, PlanResult
from hetpp.planner.baselines import BASELINES
from hetpp.planner.multisets import branch_and_bound, compositions
from hetpp.planner.problem import Problem
from hetpp.planner.search import PASS_CANDIDATES, after_schedule_pass
from hetpp.planner.shapes import Workspace
from hetpp.specs.errors import SpecError

MAX_DEVICES = 8
"""Largest cluster the oracle accepts (the number of multisets grows exponentially)."""


def search_oracle(problem: Problem, max_devices: int = MAX_DEVICES) -> PlanResult:
    """The best plan of the whole space; SpecError on clusters larger than `max_devices`."""
    n = problem.cluster.num_devices
    if n > max_devices:
        raise SpecError(
            f"the oracle enumerates every plan and accepts at most {max_devices} devices; "
            f"cluster {problem.cluster.name!r} has {n}. Use --strategy hpp",
            field="strategy",
        )
    t0 = time.perf_counter()
    ws, inc, seeds = seeded(problem, "oracle")
    for rc, mbs in ws.settings():
        ctx = ws.context(rc, mbs)
        templates = [t for c in compositions(ctx) for t in ctx.orders(c, exhaustive=True)]
        if templates:
            branch_and_bound(ctx, templates, lambda: inc.bound, partial(_offer, inc, ctx))
    elapsed = time.perf_counter() - t0
    if inc.result is None or inc.result.plan is None:
        return PlanResult("oracle", None, None, elapsed, "no plan fits")
    best = after_schedule_pass(problem, inc.results, seeds, list(inc.per_setting.values()))
    elapsed = time.perf_counter() - t0
    plan = best.plan.model_copy(update={"strategy": "oracle"})
    return PlanResult("oracle", plan, best.step, elapsed)


def seeded(problem: Problem, strategy: str) -> tuple[Workspace, Incumbent, list[PlanResult]]:
    """A workspace, an incumbent keeping `PASS_CANDIDATES` plans, and the baselines' one-chunk
    plans offered to it (they also get their own schedule pass at the end)."""
    ws = Workspace(problem, schedule_pass=False)
    inc = Incumbent(problem, strategy, keep=PASS_CANDIDATES)
    seeds = [run(problem, ws) for run in BASELINES.values()]
    for r in seeds:
        inc.offer_result(r)
    return ws, inc, seeds


def _offer(inc: Incumbent, ctx, layout) -> None:
    inc.offer(ctx, [layout])
