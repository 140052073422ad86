"""The CPU memory meter of `--memory-report`: weight copies, tracked tensors, saved tensors."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hetpp.runtime.memory import SavedTensorMeter, parameter_storages
from hetpp.runtime.recv_buffers import LiveBuffers


def test_autocast_weight_copies_count_once_and_only_during_the_region():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    meter = SavedTensorMeter(parameter_storages(lin))
    x = torch.randn(4, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False), meter.region():
        for _ in range(3):  # three micro-batches share one cached copy of each weight
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = lin(x)
            y.float().sum().backward()
        copies = (64 * 32 + 32) * 2  # weight and bias in bf16
        assert meter.copies_now == copies
    assert meter.copies_peak == copies
    assert (meter.copies_now, meter.now) == (0, 0)  # the cache is dropped with the region
    # Linear saves its weight copy (counted once, as a copy) and its input's bf16 copy, freed
    # by each backward: the peak is the copies and one input.
    assert meter.peak == copies + 4 * 64 * 2


def test_a_tracked_tensor_counts_while_it_lives_and_a_live_receive_buffer_not_at_all():
    meter = SavedTensorMeter(set())
    a, b = torch.zeros(100), torch.zeros(50)
    meter.track(a)
    meter.track(b)
    assert meter.now == 600
    del a
    assert meter.now == 200
    info = SimpleNamespace(is_root_arg=False, buffer=torch.zeros(25))
    meter.buffers = LiveBuffers()
    meter.buffers.adopt([(info,)])
    meter.buffers.restore((info,))
    meter.track(info.buffer)  # counted as a buffer, not here
    del b
    assert (meter.now, meter.peak) == (0, 600)
