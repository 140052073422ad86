"""Emulation inside a real torch.distributed.pipelining schedule: the stage's forwards and backwards
are the calls that get stretched."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from disthelpers import run_ranks
from torch.distributed.pipelining import ScheduleGPipe

from hetpp.runtime.stage import TimedStage

pytestmark = pytest.mark.dist
CPU_S = 0.01
"""CPU seconds each forward and each backward of the test stage burn."""
IDLE_S = [0.0]
"""Seconds each call also spends off the CPU, as a descheduled process would."""


def _burn() -> None:
    end = time.thread_time() + CPU_S
    while time.thread_time() < end:
        pass
    time.sleep(IDLE_S[0])


class _BurnBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _burn()
        return grad


class Burner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        _burn()
        return _BurnBackward.apply(x * self.w)


def _emulated(rank: int, world: int, init: str, slowdown: float, idle_s: float) -> float:
    """Seconds the stage's forwards and backwards took over one step."""
    IDLE_S[0] = idle_s
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        stage = TimedStage(
            Burner(), 0, 1, torch.device("cpu"), group=dist.new_group([0]), slowdown=slowdown
        )
        schedule = ScheduleGPipe(
            stage, 2, loss_fn=lambda y, t: (y - t).pow(2).sum(), scale_grads=False
        )
        schedule.step(torch.ones(4, 3), target=torch.zeros(4, 3))  # shape inference, warm-up
        stage.compute_s = 0.0
        schedule.step(torch.ones(4, 3), target=torch.zeros(4, 3))
        assert stage.submod.w.grad is not None
        return stage.compute_s
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("idle_s", [0.0, CPU_S])
def test_emulated_stage_in_a_real_schedule_lasts_at_least_factor_times_its_cpu_time(idle_s):
    # Lower bounds only: a busy machine can stretch any call, but no call can end before its CPU
    # time (the burn loop) or its sleep. The exact arithmetic is tested with a fake clock in
    # tests/unit/test_runtime_stage.py.
    calls = 4  # 2 micro-batches x (forward + backward)
    (plain,) = run_ranks(_emulated, 1, 1.0, idle_s)
    (slow,) = run_ranks(_emulated, 1, 3.0, idle_s)
    assert plain >= calls * (CPU_S + idle_s)
    assert slow >= 3 * calls * CPU_S
