"""The CPU memory meter of `--memory-report`: weight copies, tracked tensors, saved tensors."""

from __future__ import annotations

import torch

from hetpp.runtime.memory import SavedTensorMeter, parameter_storages


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


def test_a_tracked_tensor_counts_while_it_lives_and_a_forgotten_one_not_at_all():
    meter = SavedTensorMeter(set())
    a, b = torch.zeros(100), torch.zeros(50)
    meter.track(a)
    meter.track(b)
    assert meter.now == 600
    del a
    assert meter.now == 200
    meter.forget({b.untyped_storage().data_ptr()})
    assert meter.now == 0
    meter.track(b)  # excluded from now on
    del b
    assert (meter.now, meter.peak) == (0, 600)
