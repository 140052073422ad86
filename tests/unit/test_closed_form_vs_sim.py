"""The closed-form pipeline time (`hetpp.cost.pipeline`) against the event simulator on small
hand-made pipelines of every schedule: both sides computed, nothing recorded."""

import numpy as np
import pytest

from hetpp.cost.action_graph import path_ends_s
from hetpp.cost.pipeline import (
    LINE_WITHIN,
    beat_s,
    busy_stage_bound_s,
    pipeline_done_s,
    pipeline_time_s,
)
from hetpp.sim import simulate_pipeline
from hetpp.sim.trace import COMPUTE
from hetpp.specs.schedule import SCHEDULES

MULTI = [n for n, s in SCHEDULES.items() if s.multi_stage]
CHUNKS = {"one": (1,), "loop": (2, 3), "v": (2,)}
"""Chunk counts checked per placement."""


def _hops(name: str, num_devices: int, chunks: int, slow_s: float) -> list[float]:
    """10 ms between devices, 0 where a V turns on one device, `slow_s` on every crossing
    between the middle two devices (both directions, every chunk)."""
    spec, mid = SCHEDULES[name], {num_devices // 2 - 1, num_devices // 2}
    out = []
    for s in range(num_devices * chunks - 1):
        a, b = spec.device_index(s, num_devices), spec.device_index(s + 1, num_devices)
        out.append(0.0 if a == b else slow_s if {a, b} == mid else 0.01)
    return out


def _random_pipeline(rng, name: str, num_devices: int, chunks: int, slow_s: float):
    """Random stages (b 1.5-2.5 f, W 20-60% of b) and `_hops` with one slow crossing."""
    num = num_devices * chunks
    f = rng.uniform(0.2, 1.5, num)
    b = f * rng.uniform(1.5, 2.5, num)
    w = b * rng.uniform(0.2, 0.6, num)
    return list(f), list(b), _hops(name, num_devices, chunks, slow_s), list(w)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_action_graph_is_the_replay(name):
    # every schedule (1F1B and GPipe too, whose closed form is not the graph), 1-4 devices,
    # 1-3 chunks, a slow hop or none, every m torch takes up to 12: the longest path is the
    # simulator's time, and each device's end its last compute step's
    spec, rng = SCHEDULES[name], np.random.default_rng(7)
    for num_devices in (1, 2, 3, 4):
        for chunks in CHUNKS[spec.placement]:
            for slow_s in (0.0, 0.8):
                f, b, c, w = _random_pipeline(rng, name, num_devices, chunks, slow_s)
                for m in range(1, 13):
                    if spec.micro_batch_problem(num_devices * chunks, num_devices, m):
                        continue
                    trace = simulate_pipeline(f, b, c, m, name, num_devices, w)
                    ends = path_ends_s(f, b, c, m, name, num_devices, w).devices_s
                    last = trace.last_end_per_rank(COMPUTE)
                    assert ends == pytest.approx(last, rel=1e-12, abs=1e-12), (num_devices, m)
                    assert ends.max() == pytest.approx(trace.makespan_s, rel=1e-12)


@pytest.mark.parametrize("name", MULTI)
def test_multi_chunk_time_and_grads_final_are_the_graphs(name):
    # what the step cost reads: the pipeline's time, and per stage when its gradients are final
    # (never after its device's end; on the device's last stage exactly then)
    spec, rng = SCHEDULES[name], np.random.default_rng(3)
    chunks = CHUNKS[spec.placement][0]
    f, b, c, w = _random_pipeline(rng, name, 3, chunks, 0.8)
    m = 7  # the graph runs any m (torch's rounds rule aside)
    ends = path_ends_s(f, b, c, m, name, 3, w)
    total, done = pipeline_done_s(f, b, c, m, name, 3, w)
    assert total == pipeline_time_s(f, b, c, m, name, 3, w) == ends.devices_s.max()
    assert done == ends.grads_final_s.tolist()
    device = [ends.devices_s[spec.device_index(s, 3)] for s in range(3 * chunks)]
    assert all(d <= e for d, e in zip(done, device))
    assert max(done) == total


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_closed_form_within_5_percent_with_a_slow_hop_and_few_micro_batches(name):
    # 2-4 devices, one chunk of f = 1/v, b = 2/v per stage (v chunks per device), a 100 ms hop
    # in the middle (ten times the others), every m torch takes from 1 (so m < 2D included) to
    # 4D. The multi-chunk schedules' time is the action graph's (exact); 1F1B's and GPipe's
    # closed form is checked here.
    spec = SCHEDULES[name]
    chunks = 1 if spec.placement == "one" else 2
    for num_devices in (2, 3, 4):
        num = num_devices * chunks
        f, b = [1.0 / chunks] * num, [2.0 / chunks] * num
        c = _hops(name, num_devices, chunks, 0.1)
        for m in range(1, 4 * num_devices + 1):
            if spec.micro_batch_problem(num, num_devices, m):
                continue
            sim = simulate_pipeline(f, b, c, m, name, num_devices).makespan_s
            closed = pipeline_time_s(f, b, c, m, name, num_devices)
            assert closed == pytest.approx(sim, rel=0.05), (num_devices, m)


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_a_v_over_a_slow_hop_is_paced_by_its_ping_pong(name):
    # 4 devices x 2 chunks of f = 0.3, b = 0.6 (1.8 s per device and micro-batch), 0.8-1.2 s
    # between devices 1 and 2: the replay's beat (what 16 more micro-batches add, per
    # micro-batch) is the hop's ping-pong cycle, above the busiest device's work
    for hop in (0.8, 1.2):
        f, b, c = [0.3] * 8, [0.6] * 8, _hops(name, 4, 2, hop)
        t16, t32 = (simulate_pipeline(f, b, c, m, name, 4).makespan_s for m in (16, 32))
        beat = beat_s(f, b, c, name, 4)
        assert beat > 1.8 * 1.15
        assert beat == pytest.approx((t32 - t16) / 16, rel=1e-9)
        assert pipeline_time_s(f, b, c, 16, name, 4) == pytest.approx(t16, rel=0.05)


def test_1f1b_time_is_within_5_percent_of_the_replay_and_the_bound_below_it():
    # `TimingRule.graph_past`: the busy-stage bound is never above the replay; where the
    # lock-step line is within LINE_WITHIN of it the line is the time, elsewhere the graph (the
    # replay). The line is above the replay but for a few pipelines (as low as -1.3% on 300
    # random ones), so the time is within LINE_WITHIN plus that: random pipelines with a slow
    # hop and every m from 1 to 4D
    rng = np.random.default_rng(11)
    for num_devices in (2, 3, 4, 6, 8):
        for slow_s in (0.0, 0.8, 3.0):
            f, b, c, _ = _random_pipeline(rng, "1f1b", num_devices, 1, slow_s)
            for m in range(1, 4 * num_devices + 1):
                sim = simulate_pipeline(f, b, c, m, "1f1b").makespan_s
                assert busy_stage_bound_s(f, b, c, m) <= sim * (1 + 1e-12)
                got = pipeline_time_s(f, b, c, m, "1f1b")
                assert got == pytest.approx(sim, rel=0.05), (num_devices, slow_s, m)
                assert got <= sim * (1 + LINE_WITHIN) * (1 + 1e-12)
