"""Planner: hierarchical HPP search and the baselines (pure, no torch).

`plan(problem, strategy)` runs one strategy and returns a `PlanResult` (the plan, its full step
cost and the search time). Modules: `partition` (stage balance), `shapes` (pipeline templates),
`layout` (how many pipelines of each template), `balance` (data balance), `placement` (device
ids), `assemble` (plans and their cost), `search` (hpp), `baselines`, `oracle`, `feasibility`
(why nothing fits).
"""

from __future__ import annotations

from collections.abc import Callable

from hetpp.planner.assemble import PlanResult, unused_devices
from hetpp.planner.baselines import BASELINES
from hetpp.planner.oracle import search_oracle
from hetpp.planner.problem import Problem, physical_limit_samples_per_s
from hetpp.planner.search import Progress, search_hpp
from hetpp.planner.tp import search_tp
from hetpp.specs.errors import SpecError

Strategy = Callable[[Problem, Progress | None], PlanResult]


def _without_progress(run: Callable[[Problem], PlanResult]) -> Strategy:
    return lambda problem, progress: run(problem)


STRATEGIES: dict[str, Strategy] = {
    **{name: _without_progress(run) for name, run in BASELINES.items()},
    "hpp": search_hpp,
    "oracle": _without_progress(search_oracle),
}
"""Every strategy by name, in the order comparisons show them: the baselines, hpp, the oracle
(exhaustive over hpp's space, small clusters only)."""


def plan(
    problem: Problem,
    strategy: str = "hpp",
    progress: Progress | None = None,
    time_limit_s: float | None = None,
) -> PlanResult:
    """Run one strategy on a problem; `time_limit_s` (hpp only) returns the best plan found by
    then (per TP degree assignment when `problem.tp_search`)."""
    if strategy not in STRATEGIES:
        raise SpecError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if problem.tp_search:
        return search_tp(problem, lambda p: plan(p, strategy, progress, time_limit_s))
    if time_limit_s is not None:
        if strategy != "hpp":
            raise SpecError(
                f"a time limit applies to the hpp search only, not to {strategy!r}",
                field="time_limit",
            )
        return search_hpp(problem, progress, time_limit_s)
    return STRATEGIES[strategy](problem, progress)


__all__ = [
    "BASELINES",
    "STRATEGIES",
    "PlanResult",
    "Problem",
    "physical_limit_samples_per_s",
    "plan",
    "unused_devices",
]
