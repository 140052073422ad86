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
    buffers = LiveBuffers()
    meter.buffers = [buffers]
    buffers.adopt([(info,)])
    buffers.restore((info,))
    meter.track(info.buffer)  # counted as a buffer, not here
    del b
    assert (meter.now, meter.peak) == (0, 600)


def test_the_meter_sees_what_a_split_backward_keeps_from_its_i_to_its_w_until_it_dies():
    # torch's I (`stage_backward_input`) leaves the forward's saved tensors packed for the W
    # and catches the gradients flowing into the weighted ops, which are no saved tensors:
    # the probe tracks those from the stage's `backward_state`. Both count until the W drops
    # them, and nothing stays counted after.
    import gc

    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    from hetpp.runtime.memory import pending_weight_grad_inputs
    from hetpp.runtime.model import build_layer
    from hetpp.specs import PRESETS
    from hetpp.specs.model import ModelSpec

    torch.manual_seed(0)
    config, seq, batch = PRESETS["tiny-llama"], 8, 2
    block = build_layer(config, 1, seed=0, dtype=torch.float32)
    meter = SavedTensorMeter(parameter_storages(block))
    x = torch.randn(batch, seq, config.hidden_size, requires_grad=True)
    with meter.region():
        out = block(x)
        held = meter.now
        grad = torch.ones_like(out)  # the output gradient, received
        _, groups = stage_backward_input([out], [grad], [x], block.parameters())
        assert meter.now == held  # the saved tensors stay counted for the W
        stage = SimpleNamespace(backward_state={0: ([x], groups, [out], [grad])})
        for kept in pending_weight_grad_inputs(stage, 0):
            meter.track(kept)
        spec = ModelSpec(config=config, seq_len=seq, dtype_bytes=4).layers[1]
        assert meter.now - held == batch * spec.weight_grad_input_bytes_per_sample
        stage_backward_weight(block.parameters(), groups)
        del stage, groups, out, grad, kept
        gc.collect()
    assert meter.now == 0
    assert all(p.grad is not None for p in block.parameters())
