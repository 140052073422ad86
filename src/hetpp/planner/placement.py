"""Placement: concrete device ids for pipelines given as runs of GPU types.

Devices of one type in one node are interchangeable, so placing a run of n devices of a type
only decides which nodes it uses. Runs are placed largest first; a run goes whole into the
fullest-fitting node when one has room (best fit keeps big gaps for big runs), else over the
nodes with the most free devices (fewest node crossings, so fewest slow links).
"""

from __future__ import annotations

from collections.abc import Sequence

from hetpp.planner.problem import Problem
from hetpp.planner.shapes import Runs


def place(problem: Problem, pipelines: Sequence[Runs]) -> list[tuple[int, ...]] | None:
    """Device ids per stage for each pipeline; None if the cluster has too few devices."""
    free = {k: [list(n) for n in pool.nodes] for k, pool in problem.pools.items()}
    tasks = [
        (-n, p, r, key, n) for p, runs in enumerate(pipelines) for r, (key, n) in enumerate(runs)
    ]
    chosen: dict[tuple[int, int], list[int]] = {}
    for _, p, r, key, n in sorted(tasks):
        got = _take(free.get(key, []), n)
        if got is None:
            return None
        chosen[(p, r)] = got
    return [
        tuple(d for r in range(len(runs)) for d in chosen[(p, r)])
        for p, runs in enumerate(pipelines)
    ]


def _take(nodes: list[list[int]], n: int) -> list[int] | None:
    if sum(len(x) for x in nodes) < n:
        return None
    fitting = [i for i, x in enumerate(nodes) if len(x) >= n]
    if fitting:
        i = min(fitting, key=lambda i: (len(nodes[i]), i))
        got, nodes[i][:] = nodes[i][:n], nodes[i][n:]
        return got
    got = []
    for i in sorted(range(len(nodes)), key=lambda i: (-len(nodes[i]), i)):
        k = min(n - len(got), len(nodes[i]))
        got += nodes[i][:k]
        nodes[i][:] = nodes[i][k:]
        if len(got) == n:
            break
    return got
