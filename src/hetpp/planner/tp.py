"""Tensor-parallel degree per GPU type, searched around a strategy.

Every stage of one GPU type is a TP group of one degree: 1, 2, 4 or 8 devices of one node,
dividing the model's heads, KV heads and MLP width (`specs.plan.tp_divisibility_error`). A
degree per type is a Problem (`Problem.tp_degrees`) whose pools hold groups instead of devices,
so the strategy searches shapes, splits and batch shares over those units exactly as it does
over devices, with the TP cost rules (`cost.tp`) in every stage it prices. Assignments are
visited in order of the optimistic bound of their best setting (`bounds.ideal_time_bound`) and
skipped once that bound cannot beat the best plan found; all-ones (no TP) is one of them, so the
search never returns a slower plan than without TP.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import replace

from hetpp.planner.assemble import PlanResult
from hetpp.planner.bounds import ideal_time_bound
from hetpp.planner.problem import Problem
from hetpp.specs.plan import tp_divisibility_error

TP_DEGREES = (1, 2, 4, 8)
"""Degrees tried per GPU type (those a node of the type holds)."""


def degree_options(problem: Problem) -> dict[str, list[int]]:
    """Per GPU type, the degrees its largest node holds and the model's shapes allow."""
    base = replace(problem, tp_degrees={}, tp_search=False)
    return {
        key: [
            k
            for k in TP_DEGREES
            if k <= pool.gpus_per_node and tp_divisibility_error(problem.model.config, k) is None
        ]
        for key, pool in base.pools.items()
    }


def degree_problems(problem: Problem) -> list[Problem]:
    """One problem per assignment of a degree to every GPU type."""
    options = degree_options(problem)
    return [
        replace(problem, tp_degrees=dict(zip(options, combo)), tp_search=False)
        for combo in itertools.product(*options.values())
    ]


def _bound(problem: Problem) -> float:
    settings = [(r, b) for r in problem.recompute_options() for b in problem.batch_sizes()]
    return min((ideal_time_bound(problem, r, b) for r, b in settings), default=float("inf"))


def search_tp(problem: Problem, run: Callable[[Problem], PlanResult]) -> PlanResult:
    """`run` (one strategy) over every TP degree assignment; the fastest plan found."""
    t0 = time.perf_counter()
    best: PlanResult | None = None
    tried = 0
    ranked = sorted(((_bound(p), p) for p in degree_problems(problem)), key=lambda x: x[0])
    for bound, p in ranked:
        if best is not None and bound >= best.iteration_time_s:
            break
        got = run(p)
        tried += 1
        if best is None or got.iteration_time_s < best.iteration_time_s:
            best = got
    assert best is not None
    note = f"TP degree searched per GPU type ({tried} of {len(ranked)} assignments run)"
    return replace(
        best,
        search_time_s=time.perf_counter() - t0,
        note="; ".join(x for x in (best.note, note) if x),
    )
