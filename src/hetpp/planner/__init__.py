"""Planner: hierarchical HPP search and the baselines (pure, no torch).

`plan(problem, strategy)` runs one strategy and returns a `PlanResult` (the plan, its full step
cost and the search time). Modules: `partition` (stage balance), `shapes` (pipeline templates),
`layout` (how many pipelines of each template), `balance` (data balance), `placement` (device
ids), `assemble` (plans and their cost), `search` (hpp), `baselines`, `oracle`, `feasibility`
(why nothing fits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hetpp.planner.assemble import PlanResult, unused_devices
from hetpp.planner.baselines import BASELINES
from hetpp.planner.fsdp import search_fsdp
from hetpp.planner.halves import with_half_blocks
from hetpp.planner.oracle import search_oracle
from hetpp.planner.problem import Problem, physical_limit_samples_per_s
from hetpp.planner.search import Progress, search_hpp
from hetpp.planner.sharding import search_with_sharding
from hetpp.planner.tp import search_tp
from hetpp.specs.errors import SpecError

Strategy = Callable[[Problem, Progress | None], PlanResult]


def _without_progress(run: Callable[[Problem], PlanResult]) -> Strategy:
    return lambda problem, progress: run(problem)


STRATEGIES: dict[str, Strategy] = {
    **{name: _without_progress(run) for name, run in BASELINES.items()},
    "hpp": search_hpp,
    "fsdp": _without_progress(search_fsdp),
    "oracle": _without_progress(search_oracle),
}
"""Every strategy by name, in the order comparisons show them: the baselines, hpp, fsdp (the
fully sharded family), the oracle (exhaustive over hpp's space, small clusters only)."""

FAMILIES = ("hpp", "fsdp")
"""The plan families `best` (the default of `hetpp plan`) runs, keeping the fastest plan."""
BEST = "best"


def search_best(
    problem: Problem, progress: Progress | None = None, time_limit_s: float | None = None
) -> PlanResult:
    """Every family (`FAMILIES`); the fastest plan, its search time the families' total. A time
    limit applies to hpp's search."""
    results = [search_hpp(problem, progress, time_limit_s)]
    results += [STRATEGIES[name](problem, None) for name in FAMILIES if name != "hpp"]
    feasible = [r for r in results if r.feasible]
    best = min(feasible, key=lambda r: r.iteration_time_s) if feasible else results[0]
    others = tuple(r for res in results for r in (res, *res.others) if r is not best)
    return replace(best, search_time_s=sum(r.search_time_s for r in results), others=others)


def plan(
    problem: Problem,
    strategy: str = "hpp",
    progress: Progress | None = None,
    time_limit_s: float | None = None,
) -> PlanResult:
    """Run one strategy (or `best`: every family) on a problem, over the sharding choices
    `problem.sharding_mode` allows (`planner.sharding`) and, when `problem.tp_search`, the TP
    degree assignments (`planner.tp`); `time_limit_s` (hpp and best) returns the best plan found
    by then (per TP degree assignment)."""
    if strategy != BEST and strategy not in STRATEGIES:
        raise SpecError(
            f"unknown strategy {strategy!r}; expected one of {BEST}, {', '.join(STRATEGIES)}"
        )
    if time_limit_s is not None and strategy not in ("hpp", BEST):
        raise SpecError(
            f"a time limit applies to the hpp search only, not to {strategy!r}",
            field="time_limit",
        )

    def run(p: Problem, limit_s: float | None) -> PlanResult:
        if p.tp_search:
            return search_tp(p, lambda q: run(q, limit_s))
        if strategy == BEST:
            return search_best(p, progress, limit_s)
        if limit_s is not None:
            return search_hpp(p, progress, limit_s)
        return STRATEGIES[strategy](p, progress)

    result = search_with_sharding(problem, run, time_limit_s)
    if strategy in ("hpp", BEST):
        result = with_half_blocks(problem, result, time_limit_s)
    if result.feasible:  # checked as a plan file is: a slip (samples short of the batch) fails
        result.plan.validate_plan(problem.cluster)  # here, not silently in training
    return result


__all__ = [
    "BASELINES",
    "BEST",
    "FAMILIES",
    "STRATEGIES",
    "PlanResult",
    "Problem",
    "physical_limit_samples_per_s",
    "plan",
    "unused_devices",
]
