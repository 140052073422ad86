"""The closed-form pipeline time (`hetpp.cost.pipeline`) against the event simulator on small
hand-made pipelines of every schedule: both sides computed, nothing recorded."""

import numpy as np
import pytest

from hetpp.cost.pipeline import beat_s, first_reach_s, pipeline_time_s, weight_grad_s
from hetpp.sim import simulate_pipeline
from hetpp.specs.schedule import SCHEDULES

MULTI = [n for n, s in SCHEDULES.items() if s.placement != "one"]


def _hops(name: str, num_devices: int, chunks: int, slow_s: float) -> list[float]:
    """10 ms between devices, 0 where a V turns on one device, `slow_s` on every crossing
    between the middle two devices (both directions, every chunk)."""
    spec, mid = SCHEDULES[name], {num_devices // 2 - 1, num_devices // 2}
    out = []
    for s in range(num_devices * chunks - 1):
        a, b = spec.device_index(s, num_devices), spec.device_index(s + 1, num_devices)
        out.append(0.0 if a == b else slow_s if {a, b} == mid else 0.01)
    return out


@pytest.mark.parametrize("name", MULTI)
def test_first_reach_is_a_path_through_the_replay(name):
    # a lower bound on every pipeline: random stages, a slow hop, every m torch takes up to 12
    spec, rng = SCHEDULES[name], np.random.default_rng(7)
    for num_devices in (1, 2, 3, 4):
        for chunks in (2, 3) if spec.placement == "loop" else (2,):
            num = num_devices * chunks
            f = list(rng.uniform(0.2, 1.5, num))
            b = [x * rng.uniform(1.5, 2.5) for x in f]
            c = _hops(name, num_devices, chunks, 0.8)
            for m in range(1, 13):
                if spec.micro_batch_problem(num, num_devices, m):
                    continue
                w = [weight_grad_s(x) for x in b]
                sim = simulate_pipeline(f, b, c, m, name, num_devices, w).makespan_s
                assert first_reach_s(f, b, c, m, name, num_devices, w) <= sim * (1 + 1e-12)


def test_first_reach_is_the_replay_of_one_micro_batch_through_a_loop():
    # interleaved 1F1B, 3 devices x 2 chunks, m = 1: the one micro-batch's path is the step
    f, b = [1.0, 2.0, 1.5, 0.5, 1.0, 2.5], [2.0, 3.0, 2.0, 1.0, 2.0, 4.0]
    c = [0.1, 0.2, 0.3, 0.1, 0.2]
    sim = simulate_pipeline(f, b, c, 1, "interleaved-1f1b", 3).makespan_s
    assert sim == pytest.approx(sum(f) + sum(b) + 2 * sum(c), rel=1e-12)
    w = [weight_grad_s(x) for x in b]
    assert first_reach_s(f, b, c, 1, "interleaved-1f1b", 3, w) == pytest.approx(sim, rel=1e-12)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_closed_form_within_5_percent_with_a_slow_hop_and_few_micro_batches(name):
    # 2-4 devices, one chunk of f = 1/v, b = 2/v per stage (v chunks per device), a 100 ms hop
    # in the middle (ten times the others), every m torch takes from 1 (so m < 2D included) to
    # 4D. Before this test's change interleaved zero-bubble at m = 3-4 was 6-9% over (its
    # few-micro-batch line) and ZB-V at m = 1-2 5-9% short (the turn's W on the way back).
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
