"""The memory replay (`memory._holding_states`, a numpy running sum over `order_columns`) against
a step-by-step replay of the registry's orders, and `in_flight_counts`' numpy peak against the
scalar `max` over the same states, float for float."""

import random

import numpy as np
import pytest

from hetpp.cost.memory import _holding_states
from hetpp.specs.schedule import SCHEDULES

SPLIT_OR_CHUNKED = [n for n, s in SCHEDULES.items() if s.placement != "one" or s.splits_backward]
CHUNKS = {"one": (1,), "loop": (2, 3), "v": (2,)}


def _stepwise(spec, num_devices: int, chunks: int, m: int) -> list[list[tuple[int, ...]]]:
    """Per device, the distinct (held but not pending, pending) counts per stage after each F
    and I, sorted as tuples sort, those another state holds at least as many of everywhere left
    out, then written as (held, pending) counts."""
    out = []
    for d in range(num_devices):
        order = spec.order(d, num_devices, chunks, m)
        stages = sorted({s for _, s, _ in order})
        counts = [0] * (2 * len(stages))
        seen = set()
        for kind, stage, _ in order:
            j = 2 * stages.index(stage)
            if kind == "F":
                counts[j] += 1
            elif kind == "I":  # a held micro-batch becomes pending
                counts[j] -= 1
                counts[j + 1] += 1
            else:  # B frees a held one, W a pending one
                counts[j + (kind == "W")] -= 1
            if kind in "FI":
                seen.add(tuple(counts))
        rows = sorted(seen)
        kept = [
            a for a in rows if not any(b != a and all(x >= y for x, y in zip(b, a)) for b in rows)
        ]
        out.append(
            [sum(((a[j] + a[j + 1], a[j + 1]) for j in range(0, len(a), 2)), ()) for a in kept]
        )
    return out


def _cases():
    for name in SPLIT_OR_CHUNKED:
        spec = SCHEDULES[name]
        for num_devices in (1, 2, 3, 5):
            for chunks in CHUNKS[spec.placement]:
                for m in (1, 2, 4, 7, 12):
                    if spec.micro_batch_problem(num_devices * chunks, num_devices, m) is None:
                        yield name, num_devices, chunks, m


@pytest.mark.parametrize(("name", "num_devices", "chunks", "m"), list(_cases()))
def test_the_replay_keeps_the_stepwise_states(name, num_devices, chunks, m):
    want = _stepwise(SCHEDULES[name], num_devices, chunks, m)
    got = _holding_states(name, num_devices, chunks, m)
    for rows, dev in zip(want, got, strict=True):
        pairs = np.stack([dev.held, dev.pending], axis=2).reshape(len(dev.held), -1)
        assert [tuple(r) for r in pairs.tolist()] == rows
        assert dev.held.shape[1] == len(dev.stages) == chunks


def test_the_numpy_peak_is_the_scalar_max_of_the_same_sums():
    # the peak among states weighed as `in_flight_counts` weighs them: with numpy stage after
    # stage, the first largest, against Python's sum and max over the same states
    from hetpp.cost import memory

    rng = random.Random(3)
    for name, num_devices, chunks, m in _cases():
        num = num_devices * chunks
        held = [rng.choice([1.0, 3.0, rng.uniform(0, 4)]) for _ in range(num)]
        pending = [rng.choice([0.0, 1.0, rng.uniform(0, 2)]) for _ in range(num)]
        for dev in _holding_states(name, num_devices, chunks, m):
            states = [
                tuple(zip(dev.stages, k, p, strict=True))
                for k, p in zip(dev.held.tolist(), dev.pending.tolist(), strict=True)
            ]
            want = max(states, key=lambda st: sum(held[s] * k + pending[s] * p for s, k, p in st))
            load = memory._state_loads(dev, held, pending)
            assert states[int(np.argmax(load))] == want
