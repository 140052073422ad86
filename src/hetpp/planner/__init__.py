"""Planner: hierarchical HPP search and the baselines (pure, no torch).

`plan(problem, strategy)` runs one strategy and returns a `PlanResult` (the plan, its full step
cost and the search time). Modules: `partition` (stage balance), `shapes` (pipeline templates),
`layout` (how many pipelines of each template), `balance` (data balance), `placement` (device
ids), `assemble` (plans and their cost), `search` (hpp), `baselines`, `oracle`, `feasibility`
(why nothing fits).
"""

from __future__ import annotations

from hetpp.planner.assemble import PlanResult, unused_devices
from hetpp.planner.baselines import BASELINES
from hetpp.planner.oracle import search_oracle
from hetpp.planner.problem import Problem, physical_limit_samples_per_s
from hetpp.planner.search import Progress, search_hpp
from hetpp.specs.errors import SpecError

STRATEGIES = ("hpp", "uniform", "layer-balanced", "data-balanced", "oracle")
"""Every strategy name, hpp first."""


def plan(problem: Problem, strategy: str = "hpp", progress: Progress | None = None) -> PlanResult:
    """Run one strategy on a problem."""
    if strategy == "hpp":
        return search_hpp(problem, progress)
    if strategy == "oracle":
        return search_oracle(problem)
    if strategy in BASELINES:
        return BASELINES[strategy](problem)
    raise SpecError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")


__all__ = [
    "STRATEGIES",
    "PlanResult",
    "Problem",
    "physical_limit_samples_per_s",
    "plan",
    "unused_devices",
]
