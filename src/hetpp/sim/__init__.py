"""Discrete-event simulator for plans (pure, no torch).

`simulate_plan(plan, cm)` replays one step event by event; `compare_with_cost` referees the cost
model's closed form against it; `schedule` holds the action lists, `engine` runs them.
"""

from hetpp.sim.engine import Collective, Deadlock, RankProgram, ScheduleError, run
from hetpp.sim.replay import plan_programs, simulate_pipeline, simulate_plan
from hetpp.sim.result import DeviceStats, SimResult
from hetpp.sim.schedule import Action, rank_actions
from hetpp.sim.validate import Agreement, compare_with_cost

__all__ = [
    "Action",
    "Agreement",
    "Collective",
    "Deadlock",
    "DeviceStats",
    "RankProgram",
    "ScheduleError",
    "SimResult",
    "compare_with_cost",
    "plan_programs",
    "rank_actions",
    "run",
    "simulate_pipeline",
    "simulate_plan",
]
