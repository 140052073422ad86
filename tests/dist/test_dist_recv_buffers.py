"""torch's receive buffers hold memory only while live (`hetpp.runtime.recv_buffers`), under
every schedule of the registry: after a step no torch-allocated buffer holds any bytes; the most
they held at once during a step is what the cost model charges (`cost.memory.recv_buffer_counts`:
under the multi-stage schedules the counts read from torch's lowered IR); and the gradients are
those of single-process training (freed storage is never read)."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
from disthelpers import run_ranks
from torch.distributed import pipelining

from hetpp.cost.memory import recv_buffer_counts
from hetpp.runtime.stage import TimedStage
from hetpp.specs.schedule import SCHEDULES

pytestmark = pytest.mark.dist
WIDTH = 8
"""Features of every activation: one sample is 64 B in float64, the size of every buffer."""
BUFFER_BYTES = WIDTH * 8
STEPS = 2


def _layers(num_stages: int) -> list[torch.nn.Linear]:
    torch.manual_seed(0)
    return [torch.nn.Linear(WIDTH, WIDTH).double() for _ in range(num_stages)]


def _data(m: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(m * WIDTH, dtype=torch.float64).reshape(m, WIDTH) / (m * WIDTH)
    return x, torch.ones(m, WIDTH, dtype=torch.float64)


def _loss(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return (y - t).pow(2).sum()


def _run(rank: int, world: int, init: str, name: str, chunks: int, m: int):
    """Per step: stage -> (peak live bytes, live bytes after the step); and each stage's
    accumulated weight gradient."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        spec = SCHEDULES[name]
        num_stages = world * chunks
        layers = _layers(num_stages)
        mine = [s for s in range(num_stages) if spec.device_index(s, world) == rank]
        cpu = torch.device("cpu")
        stages = [TimedStage(layers[s], s, num_stages, cpu, group=dist.group.WORLD) for s in mine]
        cls = getattr(pipelining, spec.torch_class)
        single = issubclass(cls, pipelining.schedules.PipelineScheduleSingle)
        sched = cls(stages[0] if single else stages, m, loss_fn=_loss, scale_grads=False)
        x, target = _data(m)
        peaks = []
        for _ in range(STEPS):
            for st in stages:
                st.recv_buffers.reset_peak()
            args = (x,) if 0 in mine else ()
            sched.step(*args, target=target if num_stages - 1 in mine else None)
            peaks.append({st.stage_index: (st.recv_buffers.peak_bytes, st.recv_buffers.live_bytes)
                          for st in stages})  # fmt: skip
        return peaks, {s: layers[s].weight.grad.tolist() for s in mine}  # no tensors via a queue
    finally:
        dist.destroy_process_group()


def _reference_grads(num_stages: int, m: int) -> list[torch.Tensor]:
    layers = _layers(num_stages)
    x, target = _data(m)
    for i in range(STEPS):  # the pipeline accumulates over its steps (no optimizer here)
        y = x
        for layer in layers:
            y = layer(y)
        _loss(y, target).backward()
    return [layer.weight.grad for layer in layers]


@pytest.mark.parametrize(
    "name,world,chunks,m",
    [
        ("1f1b", 3, 1, 5),
        ("gpipe", 3, 1, 4),
        ("interleaved-1f1b", 2, 2, 4),
        ("interleaved-zb", 2, 2, 4),
        ("zbv", 2, 2, 4),
        ("dualpipev", 2, 2, 4),
        # deeper, and m where torch's receives run furthest ahead (counts above saturation)
        ("interleaved-1f1b", 3, 2, 8),
        ("interleaved-zb", 3, 2, 6),
        ("zbv", 4, 2, 8),
        ("dualpipev", 3, 2, 7),
    ],
)
def test_receive_buffers_live_only_while_needed(name, world, chunks, m):
    spec, num_stages = SCHEDULES[name], world * chunks
    results = run_ranks(_run, world, name, chunks, m)
    want = _reference_grads(num_stages, m)
    for peaks, grads in results:
        for s, grad in grads.items():
            torch.testing.assert_close(torch.tensor(grad, dtype=torch.float64), want[s], rtol=1e-12, atol=0)
        for step in peaks:
            for s, (peak, after) in step.items():
                assert after == 0, (name, s)  # every buffer freed at the step's end
                k = spec.in_flight(s, num_stages, m, world)
                acts, grads_live = recv_buffer_counts(spec, k, m, s, num_stages, world)
                charged = BUFFER_BYTES * (acts * (s > 0) + grads_live * (s < num_stages - 1))
                allocated = BUFFER_BYTES * m * ((s > 0) + (s < num_stages - 1))  # torch's
                assert peak == charged, (name, s, peak, charged)
                if 0 < s < num_stages - 1:
                    assert peak < allocated, (name, s)
