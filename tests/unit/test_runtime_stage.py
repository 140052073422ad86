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


def test_buckets_start_in_grad_buckets_order_whatever_order_they_complete():
    # Bucket 0 merges blocks far apart and completes last; bucket 1 must still wait for it.
    from hetpp.runtime.gradsync import GradSync

    started: list[int] = []
    sync = object.__new__(GradSync)
    sync.buckets = [SimpleNamespace(id=i, waiting=1) for i in range(3)]
    sync._start = lambda b: started.append(b.id)
    sync.armed, sync.issued = True, 0
    for i in (1, 2, 0):
        sync._arrived(sync.buckets[i])
        if i != 0:
            assert started == []
    assert started == [0, 1, 2]
