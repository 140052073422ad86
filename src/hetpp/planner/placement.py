"""Placement: concrete device ids for pipelines given as runs of GPU types.

Devices of one type in one node are interchangeable, so placing a run of n devices of a type
only decides which nodes it uses. Runs are placed largest first; a run goes whole into the
fullest-fitting node when one has room (best fit keeps big gaps for big runs), else over the
nodes with the most free devices (fewest node crossings, so fewest slow links).
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence

from hetpp.planner.problem import Problem
from hetpp.planner.shapes import Runs


def place(problem: Problem, pipelines: Sequence[Runs]) -> list[tuple[int, ...]] | None:
    """Device ids per stage for each pipeline; None if the cluster has too few devices."""
    free = {k: _Free(pool.nodes) for k, pool in problem.pools.items()}
    tasks = [
        (-n, p, r, key, n) for p, runs in enumerate(pipelines) for r, (key, n) in enumerate(runs)
    ]
    chosen: dict[tuple[int, int], list[int]] = {}
    for _, p, r, key, n in sorted(tasks):
        got = free[key].take(n) if key in free else None
        if got is None:
            return None
        chosen[(p, r)] = got
    return [
        tuple(d for r in range(len(runs)) for d in chosen[(p, r)])
        for p, runs in enumerate(pipelines)
    ]


def take_runs(
    nodes: Sequence[Sequence[int]], free: Collection[int], sizes: Sequence[int]
) -> list[list[int]] | None:
    """Runs of `sizes[i]` devices out of the `free` ones among one type's `nodes` (in order),
    each taken as `place` takes a run; None if too few are free."""
    pool = _Free([[d for d in node if d in free] for node in nodes])
    runs = [pool.take(n) for n in sizes]
    return None if None in runs else runs


class _Free:
    """Free devices of one type per node, with the nodes kept sorted by (free count, index):
    each take finds its node by bisection instead of rescanning every node (a large cluster
    places thousands of runs per plan)."""

    def __init__(self, nodes: Sequence[Sequence[int]]):
        self.devices = [list(n) for n in nodes]
        self.start = [0] * len(nodes)
        """Devices of node i before this index are taken."""
        self.order = sorted((len(n), i) for i, n in enumerate(nodes) if n)
        """(free count, node index) of every node with a free device, ascending."""
        self.total = sum(len(n) for n in nodes)

    def take(self, n: int) -> list[int] | None:
        """n devices: whole from the fullest node they fit in (best fit, lowest index on ties),
        else from the nodes with the most free devices (lowest index on ties); None if fewer
        than n are free."""
        if self.total < n:
            return None
        j = bisect.bisect_left(self.order, (n, -1))
        if j < len(self.order):
            return self._from(j, n)
        got: list[int] = []
        while len(got) < n:
            most = self.order[-1][0]
            got += self._from(bisect.bisect_left(self.order, (most, -1)), n - len(got))
        return got

    def _from(self, j: int, n: int) -> list[int]:
        """Up to n devices of the node at position j of `order`."""
        free, i = self.order.pop(j)
        k = min(n, free)
        got = self.devices[i][self.start[i] : self.start[i] + k]
        self.start[i] += k
        self.total -= k
        if free > k:
            bisect.insort(self.order, (free - k, i))
        return got
