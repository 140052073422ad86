"""Emulation makes each forward and backward of a stage last its device's slowdown factor times its
CPU time, however long the process spends descheduled within it."""

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
def test_emulated_stage_lasts_factor_times_its_cpu_time(idle_s):
    calls = 4  # 2 micro-batches x (forward + backward)
    (plain,) = run_ranks(_emulated, 1, 1.0, idle_s)
    (slow,) = run_ranks(_emulated, 1, 3.0, idle_s)
    slack = 0.5 * calls * CPU_S  # bookkeeping around the compute
    # Unemulated: the calls' wall time, off-CPU time included.
    assert calls * (CPU_S + idle_s) <= plain < calls * (CPU_S + idle_s) + slack
    # Emulated 3x: 3 x the CPU time; time off the CPU (less than that) is absorbed, not added.
    assert 3 * calls * CPU_S <= slow < 3 * calls * CPU_S + slack
