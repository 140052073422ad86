"""The runtime's layers: parameter counts as the spec counts them, plan-independent init, stages
that compose to the full model, causal attention."""

from __future__ import annotations

import pytest
import torch

from hetpp.runtime.model import (
    Block,
    Embedding,
    Head,
    StageModule,
    build_layer,
    inverse_frequencies,
    rotary_table,
    token_loss_sum,
)
from hetpp.specs import PRESETS, ModelSpec

TINY = ["tiny-gpt", "tiny-llama"]


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", list(PRESETS))
def test_layer_parameter_counts_match_the_spec(name):
    c = PRESETS[name]
    spec = ModelSpec(config=c, seq_len=min(c.max_seq_len, 2048))
    with torch.device("meta"):  # no memory, no init: just the shapes
        emb, block, head = Embedding(c), Block(c), Head(c)
    assert _numel(emb) == spec.layers[0].params
    assert all(_numel(block) == spec.layers[i].params for i in range(1, c.num_layers + 1))
    assert _numel(head) == spec.layers[-1].stored_params


@pytest.mark.parametrize("name", TINY)
def test_a_full_model_owns_each_parameter_once(name):
    c = PRESETS[name]
    full = StageModule(c, 0, c.num_layers + 2, seed=0, dtype=torch.float32)
    spec = ModelSpec(config=c, seq_len=32)
    for layer in spec.layers:
        assert sum(p.numel() for _, p in full.own_parameters(layer.index)) == layer.params
    assert _numel(full) == spec.built_params


@pytest.mark.parametrize("name", TINY)
def test_initial_weights_do_not_depend_on_the_stage_cut(name):
    c = PRESETS[name]
    full = StageModule(c, 0, 6, seed=3, dtype=torch.float64)
    parts = [StageModule(c, a, b, seed=3, dtype=torch.float64) for a, b in ((0, 2), (2, 5), (5, 6))]
    for part in parts:
        for i in range(part.start, part.end):
            for (n, p), (_, q) in zip(
                part.layer(i).named_parameters(), full.layer(i).named_parameters()
            ):
                assert torch.equal(p, q), (i, n)
    x = torch.randint(0, c.vocab_size, (2, 16))
    y = x
    for part in parts:
        y = part(y)
    torch.testing.assert_close(y, full(x), rtol=0, atol=1e-12)
    other_seed = StageModule(c, 0, 6, seed=4, dtype=torch.float64)
    assert not torch.equal(other_seed.layer(1).attn.qkv.weight, full.layer(1).attn.qkv.weight)


def test_tied_head_shares_the_embedding_weight_or_starts_as_its_copy():
    c = PRESETS["tiny-gpt"]
    full = StageModule(c, 0, 6, seed=0, dtype=torch.float32)
    assert full.layer(5).lm_head.weight is full.layer(0).tok.weight
    assert full.tied_weight() is full.layer(0).tok.weight
    head_only = StageModule(c, 3, 6, seed=0, dtype=torch.float32)
    assert torch.equal(head_only.tied_weight(), full.layer(0).tok.weight)
    assert StageModule(c, 1, 3, seed=0, dtype=torch.float32).tied_weight() is None
    assert StageModule(PRESETS["tiny-llama"], 0, 6, 0, torch.float32).tied_weight() is None


@pytest.mark.parametrize("name", TINY)
def test_attention_is_causal(name):
    c = PRESETS[name]
    block = build_layer(c, 1, seed=0, dtype=torch.float64)
    x = torch.randn(1, 12, c.hidden_size, dtype=torch.float64)
    changed = x.clone()
    changed[:, 8:] += 1.0
    y, y2 = block(x), block(changed)
    torch.testing.assert_close(y[:, :8], y2[:, :8], rtol=0, atol=1e-12)
    assert not torch.allclose(y[:, 8:], y2[:, 8:])


def test_loss_is_the_sum_of_token_cross_entropies_in_the_logits_dtype():
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    targets = torch.randint(0, 5, (2, 3))
    loss = token_loss_sum(logits, targets)
    expect = -torch.log_softmax(logits, -1).gather(-1, targets[..., None]).sum()
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, expect)
    assert token_loss_sum(logits.bfloat16(), targets).dtype == torch.float32


@pytest.mark.parametrize("name", TINY)
def test_a_padded_vocabulary_trains_as_the_unpadded_model(name):
    # 200 tokens: padded to 256 by default; vocab_multiple=1 builds the unpadded model.
    padded = PRESETS[name].model_copy(update={"vocab_size": 200})
    plain = padded.model_copy(update={"vocab_multiple": 1})
    assert (padded.padded_vocab, plain.padded_vocab) == (256, 200)
    x = torch.randint(0, 200, (2, 16), generator=torch.Generator().manual_seed(0))
    models = [StageModule(c, 0, c.num_layers + 2, 0, torch.float64) for c in (padded, plain)]
    losses = []
    for m in models:
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
        for _ in range(2):  # the second step runs on weights the first one updated
            opt.zero_grad()
            logits = m(x)
            assert logits.shape == (2, 16, 200)
            loss = token_loss_sum(logits[:, :-1], x[:, 1:])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    # Same draws for the real rows, the padding's logits cut before the loss: the same losses.
    assert losses[:2] == pytest.approx(losses[2:], rel=1e-12, abs=0)
    emb = models[0].layer(0).tok.weight
    assert emb.shape == (256, padded.hidden_size) and not emb[200:].any()
    head = models[0].layer(padded.num_layers + 1).lm_head.weight
    assert head.shape == (256, padded.hidden_size) and not head[200:].any()
    torch.testing.assert_close(emb[:200], models[1].layer(0).tok.weight, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rotary_angles_are_taken_before_the_cast_to_half_precision(dtype):
    # Cast to bf16 first, the angle of position 2000 (rad) is rounded to a multiple of 8, and
    # cos/sin are those of another angle (errors up to 2.0); the table must be the float64
    # values, rounded once.
    c = PRESETS["llama2-7b"]
    cos, sin = rotary_table(c, 2048, torch.device("cpu"), dtype)
    ang = torch.outer(torch.arange(2048, dtype=torch.float64), inverse_frequencies(c))
    ang = torch.cat((ang, ang), dim=-1)
    assert cos.dtype == sin.dtype == dtype
    assert torch.equal(cos, ang.cos().to(dtype)) and torch.equal(sin, ang.sin().to(dtype))


def test_rotary_table_is_usable_by_autograd_after_inference_mode():
    c = PRESETS["tiny-llama"]
    rotary_table.cache_clear()
    with torch.inference_mode():
        rotary_table(c, 16, torch.device("cpu"), torch.float32)
    cos, _ = rotary_table(c, 16, torch.device("cpu"), torch.float32)
    x = torch.ones(16, cos.shape[-1], requires_grad=True)
    (x * cos).sum().backward()  # an inference tensor cannot be saved for backward
    assert torch.equal(x.grad, cos)
