"""hetpp's stages compute what transformers computes: for every supported family, a tiny random
model built here, its safetensors read into a three-stage split, logits and loss compared (fp32
1e-5, fp64 1e-10); and the ModelSpec the planner costs is the model the runtime builds."""

from __future__ import annotations

import pytest
import torch
from hfmodels import CONFIGS, make_hf_model, reference_forward, reference_model, transformers

from hetpp.runtime.hf_weights import export_stage, load_stage
from hetpp.runtime.model import StageModule, token_loss_sum
from hetpp.specs import ModelSpec
from hetpp.specs.presets import load_model_config

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def _pipelined(c, folder, tokens, dtype):
    n = c.num_layers + 2
    out = tokens
    for start, end in ((0, 2), (2, n - 1), (n - 1, n)):  # embedding+block | blocks | head
        stage = StageModule(c, start, end, seed=0, dtype=dtype)
        load_stage(stage, folder)
        with torch.no_grad():
            out = stage(out)
    return out


@pytest.fixture(scope="module", params=list(CONFIGS))
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, make_hf_model(request.param, folder)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_logits_and_loss_equal_transformers(family, dtype):
    name, folder, hf = family
    c = load_model_config(folder)
    tokens = torch.randint(0, c.vocab_size, (2, 13), generator=torch.Generator().manual_seed(1))
    want_logits, want_loss = reference_forward(reference_model(name, hf, dtype), tokens, dtype)
    logits = _pipelined(c, folder, tokens[:, :-1], dtype)
    loss = token_loss_sum(logits, tokens[:, 1:]) / tokens[:, 1:].numel()
    assert logits.dtype == dtype
    assert (logits - want_logits).abs().max().item() <= TOL[dtype]
    assert abs(loss.item() - want_loss.item()) <= TOL[dtype]


def test_the_costed_spec_is_the_built_model(family):
    _, folder, hf = family
    c = load_model_config(folder)
    spec = ModelSpec(config=c, seq_len=16)
    assert spec.total_params == sum(p.numel() for p in hf.parameters())
    full = StageModule(c, 0, c.num_layers + 2, seed=0, dtype=torch.float32)
    assert sum(p.numel() for p in full.parameters()) == spec.built_params
    for layer in spec.layers:
        assert sum(p.numel() for _, p in full.own_parameters(layer.index)) == layer.params


def test_export_loads_back_in_transformers(family, tmp_path):
    _, folder, hf = family
    c = load_model_config(folder)
    full = StageModule(c, 0, c.num_layers + 2, seed=0, dtype=torch.float32)
    load_stage(full, folder)
    out = export_stage(full, tmp_path / "export")
    again = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert load_model_config(out).first_difference(c) is None
    tokens = torch.randint(0, c.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
    want, _ = reference_forward(hf.eval(), tokens, torch.float32)
    got, _ = reference_forward(again.eval(), tokens, torch.float32)
    assert (got - want).abs().max().item() == 0.0  # the same weights, the same code
