"""TimedStage's emulation arithmetic on a fake clock: a call lasts `factor x` its CPU time, time
spent off the CPU within that is absorbed, and nothing depends on how busy the machine is."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hetpp.runtime import stage as stage_module
from hetpp.runtime.stage import TimedStage


class FakeClock:
    """Wall and thread-CPU time that only move when the test says so."""

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0

    def perf_counter(self) -> float:
        return self.wall_s

    def thread_time(self) -> float:
        return self.cpu_s

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.wall_s += seconds

    def work(self, cpu_s: float, idle_s: float) -> None:
        """A compute call: `cpu_s` on the CPU and `idle_s` descheduled."""
        self.cpu_s += cpu_s
        self.wall_s += cpu_s + idle_s


@pytest.mark.parametrize(
    ("factor", "cpu_s", "idle_s", "expected_s"),
    [
        (1.0, 0.25, 0.0, 0.25),  # no emulation: the call's wall time
        (1.0, 0.25, 0.5, 0.75),  # ... off-CPU time included
        (3.0, 0.25, 0.0, 0.75),  # emulated: factor x CPU time
        (3.0, 0.25, 0.25, 0.75),  # off-CPU time below the target is absorbed, not added
        (3.0, 0.25, 1.0, 1.25),  # beyond it the call already took longer: no sleep
    ],
)
def test_timed_call_lasts_factor_times_cpu_time(monkeypatch, factor, cpu_s, idle_s, expected_s):
    clock = FakeClock()
    monkeypatch.setattr(stage_module, "time", clock)
    fake_stage = SimpleNamespace(device=torch.device("cpu"), slowdown=factor, compute_s=0.0)
    for _ in range(2):
        out = TimedStage._timed(fake_stage, lambda: clock.work(cpu_s, idle_s) or "result")
        assert out == "result"
    # Binary fractions: the sums are exact on every CPU.
    assert fake_stage.compute_s == 2 * expected_s
    assert clock.wall_s == 2 * expected_s


def _fake_sync(buckets: dict[str, list[tuple[str, int]]]):
    """A GradSync without process groups: each bucket's (parameter, local stage) list; started
    buckets are recorded by name."""
    from hetpp.runtime.gradsync import Bucket, GradSync

    params = {n: torch.nn.Parameter(torch.zeros(1)) for ps in buckets.values() for n, _ in ps}
    sync = object.__new__(GradSync)
    sync.buckets, sync.stage_params = [], [[], []]
    for name, ps in buckets.items():
        bucket = Bucket((0, 1), ((0, 1),), [params[n] for n, _ in ps])
        bucket.name = name
        sync.buckets.append(bucket)
        for n, stage in ps:
            sync.stage_params[stage].append((params[n], bucket))
    started: list[str] = []
    sync._start = lambda b: started.append(b.name)
    sync._reset()
    return sync, params, started


def test_buckets_start_in_grad_buckets_order_whatever_order_they_complete():
    # Bucket a merges blocks far apart and completes last; b must still wait for it.
    sync, params, started = _fake_sync({"a": [("x", 0)], "b": [("y", 0)], "c": [("z", 0)]})
    sync.arm(0)
    for name, param in (("b", "y"), ("c", "z"), ("a", "x")):
        sync._arrived(params[param], 0, sync.buckets["abc".index(name)])
        if name != "a":
            assert started == []
    assert started == ["a", "b", "c"]


def test_a_bucket_completes_with_the_last_backward_of_every_stage_holding_it():
    # Two local stages (model chunks); bucket b holds parameters of both.
    sync, params, started = _fake_sync(
        {"a": [("x", 1)], "b": [("y", 0), ("w", 1)], "c": [("z", 0)]}
    )
    bucket = dict(zip("abc", sync.buckets))
    sync._arrived(params["y"], 0, bucket["b"])  # an earlier micro-batch's backward: not final
    sync.arm(1)  # chunk 1's last full backward: its hooks count ...
    sync._arrived(params["w"], 1, bucket["b"])
    assert started == [] and bucket["b"].waiting == 1
    sync.finish(1)  # ... and when it returns, every parameter of chunk 1 is final
    assert started == ["a"]
    # Chunk 0's last weight-grad action: no hook fires (torch assigns .grad itself), finish does.
    sync.arm(0)
    sync.finish(0)
    assert started == ["a", "b", "c"]
