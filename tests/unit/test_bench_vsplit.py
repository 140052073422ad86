"""`bench/vsplit.py`'s DP over V splits: the least busiest device, against every split."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from bench_modules import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("vsplit")


def _brute(work, near, tau):
    """The least busiest device over every V split with bounds in `near`, stages <= tau."""
    devices, num = len(work), len(near) - 1
    best = None
    for cuts in itertools.product(*near):
        if any(a >= b for a, b in itertools.pairwise(cuts)):
            continue
        stage = [
            work[min(s, num - 1 - s)][cuts[s + 1]] - work[min(s, num - 1 - s)][cuts[s]]
            for s in range(num)
        ]
        if max(stage) > tau:
            continue
        busiest = max(stage[d] + stage[num - 1 - d] for d in range(devices))
        best = busiest if best is None else min(best, busiest)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_least_busiest_is_the_best_v_split(bench, seed):
    rng = np.random.default_rng(seed)
    layers, devices = 9, 3  # 6 stages: device d runs stages d and 5 - d
    work = [
        np.concatenate([[0.0], np.cumsum(rng.uniform(0.5, 2.0, layers) * speed)])
        for speed in (1.0, 1.7, 2.5)
    ]
    cuts = [0, 1, 3, 4, 6, 7, 9]
    near = bench.near_cuts(cuts, 2)
    for tau in (np.inf, 4.0):
        got = bench.least_busiest(work, near, tau)
        want = _brute(work, near, tau)
        if want is None:
            assert got is None
            continue
        value, bounds = got
        assert value == want
        stage = [
            work[min(s, 5 - s)][bounds[s + 1]] - work[min(s, 5 - s)][bounds[s]] for s in range(6)
        ]
        assert max(stage[d] + stage[5 - d] for d in range(devices)) == value  # the split reaches it
