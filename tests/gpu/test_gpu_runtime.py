"""The runtime's layers and profiler on a CUDA device (skipped without one)."""

from __future__ import annotations

import pytest
import torch

from hetpp.runtime.model import StageModule, token_loss_sum
from hetpp.runtime.profiler import profile_model
from hetpp.specs import PRESETS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama"])
def test_cuda_and_cpu_compute_the_same_model(name):
    c = PRESETS[name]
    tokens = torch.randint(0, c.vocab_size, (2, 32))
    losses = []
    for device in ("cpu", "cuda"):
        model = StageModule(c, 0, c.num_layers + 2, seed=0, dtype=torch.float64).to(device)
        x = tokens.to(device)
        losses.append(token_loss_sum(model(x), x).item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-9)


def test_profiler_times_layers_with_cuda_events():
    rows = profile_model(
        PRESETS["tiny-gpt"], "GPU", [1, 2], 64, torch.device("cuda"), torch.bfloat16, repeats=3
    )
    assert [(r.layer, r.mbs) for r in rows] == [
        (k, m) for k in ("embedding", "block", "head") for m in (1, 2)
    ]
    assert all(r.fwd_s > 0 and r.bwd_s > 0 and r.act_bytes > 0 for r in rows)
