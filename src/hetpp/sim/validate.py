"""The simulator as referee: how far the cost model's closed form is from the event replay."""

from __future__ import annotations

from dataclasses import dataclass

from hetpp.cost.compute import CostModel
from hetpp.cost.step import step_cost
from hetpp.sim.replay import simulate_plan
from hetpp.specs.plan import Plan


@dataclass(frozen=True)
class Agreement:
    """Closed form (`step_cost`) against simulation for one plan."""

    closed_form_s: float
    """step_cost's iteration time."""
    simulated_s: float
    """The simulator's iteration time."""
    closed_pipeline_s: tuple[float, ...]
    simulated_pipeline_s: tuple[float, ...]
    closed_exposed_sync_s: float
    simulated_exposed_sync_s: float

    @property
    def rel_diff(self) -> float:
        """(closed - simulated) / simulated: positive when the closed form is pessimistic."""
        return (self.closed_form_s - self.simulated_s) / self.simulated_s

    @property
    def pipeline_rel_diff(self) -> tuple[float, ...]:
        return tuple((c - s) / s for c, s in zip(self.closed_pipeline_s, self.simulated_pipeline_s))


def compare_with_cost(plan: Plan, cm: CostModel) -> Agreement:
    """Cost the plan both ways with the same per-micro-batch costs."""
    closed = step_cost(plan, cm)
    sim = simulate_plan(plan, cm)
    return Agreement(
        closed.iteration_time_s,
        sim.iteration_time_s,
        closed.pipeline_time_s,
        sim.pipeline_time_s,
        closed.exposed_sync_s,
        sim.exposed_sync_s,
    )
