"""Emulation stretches each forward and backward of a stage by its device's slowdown factor."""

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
WALL = [0.0]
"""Wall seconds those calls took (more than CPU_S when the machine is busy)."""


def _burn() -> None:
    t0, end = time.perf_counter(), time.thread_time() + CPU_S
    while time.thread_time() < end:
        pass
    WALL[0] += time.perf_counter() - t0


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


def _stretch(rank: int, world: int, init: str, slowdown: float) -> float:
    """Seconds the stage's compute took beyond the burning itself, over one step."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        stage = TimedStage(
            Burner(), 0, 1, torch.device("cpu"), group=dist.new_group([0]), slowdown=slowdown
        )
        schedule = ScheduleGPipe(
            stage, 2, loss_fn=lambda y, t: (y - t).pow(2).sum(), scale_grads=False
        )
        schedule.step(torch.ones(4, 3), target=torch.zeros(4, 3))  # shape inference, warm-up
        stage.compute_s, WALL[0] = 0.0, 0.0
        schedule.step(torch.ones(4, 3), target=torch.zeros(4, 3))
        assert stage.submod.w.grad is not None
        return stage.compute_s - WALL[0]
    finally:
        dist.destroy_process_group()


def test_emulated_stage_sleeps_factor_minus_one_times_its_compute():
    calls = 4  # 2 micro-batches x (forward + backward)
    (plain,) = run_ranks(_stretch, 1, 1.0)
    (slow,) = run_ranks(_stretch, 1, 3.0)
    assert 0 <= plain < 0.5 * calls * CPU_S  # only bookkeeping around the compute
    assert 2 * calls * CPU_S <= slow < 2 * calls * CPU_S + 0.5 * calls * CPU_S
