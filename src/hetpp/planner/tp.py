"""Tensor-parallel degree per GPU type, searched around a strategy.

Every stage of one GPU type is a TP group of one degree: 1, 2, 4 or 8 devices of one node,
dividing the model's heads, KV heads and MLP width (`specs.plan.tp_divisibility_error`). A
degree per type is a Problem (`Problem.tp_degrees`) whose pools hold groups instead of devices,
so the strategy searches shapes, splits and batch shares over those units exactly as it does
over devices, with the TP cost rules (`cost.tp`) in every stage it prices. All-ones (no TP) is
tried first, so the search never returns a slower plan than without TP; an assignment whose
optimistic bound (`bounds.ideal_time_bound`, best setting) cannot beat the best plan found is
skipped.
"""

from __future__ import annotations

import itertools
import math
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


EXHAUSTIVE = 16
"""Up to this many assignments (two types of four degrees) every one is tried; beyond, one type
at a time (coordinate descent from all-ones)."""


def _with_degrees(problem: Problem, degrees: dict[str, int]) -> Problem:
    return replace(problem, tp_degrees=degrees, tp_search=False)


def _bound(problem: Problem) -> float:
    settings = [(r, b) for r in problem.recompute_options() for b in problem.batch_sizes()]
    return min((ideal_time_bound(problem, r, b) for r, b in settings), default=float("inf"))


class _Best:
    """The fastest result so far over the assignments tried (each tried once)."""

    def __init__(self, problem: Problem, run: Callable[[Problem], PlanResult]):
        self.problem, self.run = problem, run
        self.result: PlanResult | None = None
        self.degrees: dict[str, int] = {}
        self.tried: set[tuple[int, ...]] = set()
        self.searched = 0

    def offer(self, degrees: dict[str, int]) -> bool:
        """Run `degrees` unless tried or its bound cannot win; True if it is the new best."""
        key = tuple(degrees.values())
        if key in self.tried:
            return False
        self.tried.add(key)
        p = _with_degrees(self.problem, degrees)
        if self.result is not None and _bound(p) >= self.result.iteration_time_s:
            return False
        got = self.run(p)
        self.searched += 1
        if self.result is None or got.iteration_time_s < self.result.iteration_time_s:
            self.result, self.degrees = got, degrees
            return True
        return False


def search_tp(problem: Problem, run: Callable[[Problem], PlanResult]) -> PlanResult:
    """`run` (one strategy) over TP degree assignments; the fastest plan found. Every
    assignment when there are at most `EXHAUSTIVE`, else one type at a time: each type's
    degrees with the others fixed, keeping any that wins, until a sweep changes nothing."""
    t0 = time.perf_counter()
    options = degree_options(problem)
    best = _Best(problem, run)
    best.offer(dict.fromkeys(options, 1))
    total = math.prod(len(v) for v in options.values())
    if total <= EXHAUSTIVE:
        for combo in itertools.product(*options.values()):
            best.offer(dict(zip(options, combo)))
    else:
        changed = True
        while changed:
            changed = False
            for key, degrees in options.items():
                for k in degrees:
                    changed |= best.offer({**best.degrees, key: k})
    assert best.result is not None
    how = "all" if total <= EXHAUSTIVE else "one type at a time over"
    note = (
        f"TP degree per GPU type searched ({how} {total} assignments: "
        f"{len(best.tried)} considered, {best.searched} searched)"
    )
    return replace(
        best.result,
        search_time_s=time.perf_counter() - t0,
        note="; ".join(x for x in (best.result.note, note) if x),
    )
