import json

import pytest

from hetpp.specs import PRESETS, SpecError, load_model, load_model_config
from hetpp.specs.model import ModelSpec, block_params

# Exact parameter counts published with the Hugging Face checkpoints.
HF_EXACT = {"llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama3-8b": 8_030_261_248}
# GPT-3 paper, Table 2.1, with the paper's layer/width figures. The labels are rounded: the three
# smaller models compute to 1.2-1.8% off their label (355.9M, 1.316B, 2.652B), the two larger ones
# are within 1%. Tolerance per preset: 1% unless the label's rounding alone explains more.
GPT3_NOMINAL = {
    "gpt3-350m": (350e6, 0.018),
    "gpt3-1.3b": (1.3e9, 0.013),
    "gpt3-2.7b": (2.7e9, 0.019),
    "gpt3-6.7b": (6.7e9, 0.01),
    "gpt3-13b": (13e9, 0.012),
}


@pytest.mark.parametrize("name", HF_EXACT)
def test_llama_presets_match_published_counts_exactly(name):
    assert load_model(name, 2048).total_params == HF_EXACT[name]


@pytest.mark.parametrize("name", GPT3_NOMINAL)
def test_gpt3_presets_round_to_published_sizes(name):
    n = load_model(name, 2048).total_params
    nominal, tol = GPT3_NOMINAL[name]
    rel = abs(n - nominal) / nominal
    print(f"{name}: {n:,} parameters, {100 * rel:.2f}% from the paper's {nominal:.3g}")
    assert rel < tol


def test_block_params_match_the_measured_h200_modules():
    # `params` column of the shipped H200 profiles: GPT block h=1024 and the llama2-7b block.
    gpt = PRESETS["gpt3-350m"]
    assert block_params(gpt) == 12_596_224
    assert block_params(PRESETS["llama2-7b"]) == 202_383_360
    assert block_params(PRESETS["llama3-8b"]) == 218_112_000


def test_layer_list_shape_and_flops():
    m = load_model("gpt3-1.3b", 2048)
    assert m.layer_list_len == 26 and [x.kind for x in m.layers[:2]] == ["embedding", "block"]
    assert m.layers[-1].kind == "head"
    h, s = 2048, 2048
    blk = m.layers[1]
    assert blk.fwd_flops_per_token == 2 * 12 * h * h + 4 * s * h
    assert blk.send_bytes_per_sample == s * h * 2
    assert blk.saved_bytes_recompute_per_sample == s * h * 2
    # Tied head: the stage holding it stores the matrix, the model counts it once. The matrix
    # has 50257 rounded up to 393 x 128 = 50304 rows; the padding is built, not published.
    assert m.layers[-1].params == 2 * h and m.layers[-1].stored_params == 2 * h + 50304 * h
    assert m.layers[-1].fwd_flops_per_token == 2 * h * 50304
    assert m.layers[0].padding_params == 47 * h
    assert m.built_params == m.total_params + 47 * h


def test_vocab_multiple_one_turns_padding_off():
    c = load_model("gpt3-1.3b", 2048).config
    assert (c.padded_vocab, c.model_copy(update={"vocab_multiple": 1}).padded_vocab) == (
        50304,
        50257,
    )
    off = ModelSpec(config=c.model_copy(update={"vocab_multiple": 1}), seq_len=2048)
    assert off.built_params == off.total_params == load_model("gpt3-1.3b", 2048).total_params
    assert off.layers[-1].fwd_flops_per_token == 2 * 2048 * 50257
    # An aligned vocabulary (Llama-2's 32000 = 250 x 128) is not padded.
    assert load_model("llama2-7b", 2048).config.padded_vocab == 32000


def test_gpt_saved_activations_match_h200_measurement():
    # h200_gpt_layers.csv: block h=1024, seq 2048, mbs 1 kept 67,273,728 bytes (32.08 s*h*2).
    m = ModelSpec(config=PRESETS["gpt3-350m"], seq_len=2048)
    assert m.layers[1].saved_bytes_per_sample == pytest.approx(67_273_728, rel=0.01)


def _write(tmp_path, cfg):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    return f


def test_hf_llama_config(tmp_path):
    cfg = {
        "model_type": "llama",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "intermediate_size": 11008,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
    }
    c = load_model_config(_write(tmp_path, cfg))
    assert ModelSpec(config=c, seq_len=4096).total_params == HF_EXACT["llama2-7b"]


def test_hf_mistral_qwen2_gpt2_neox(tmp_path):
    mistral = {
        "model_type": "mistral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
    }
    assert (
        ModelSpec(config=load_model_config(_write(tmp_path, mistral)), seq_len=4096).total_params
        == 7_241_732_096
    )
    qwen = {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    }
    assert (
        ModelSpec(config=load_model_config(_write(tmp_path, qwen)), seq_len=2048).total_params
        == 494_032_768
    )  # Qwen2-0.5B
    gpt2 = {
        "model_type": "gpt2",
        "vocab_size": 50257,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_positions": 1024,
    }
    assert (
        ModelSpec(config=load_model_config(_write(tmp_path, gpt2)), seq_len=1024).total_params
        == 124_439_808
    )  # GPT-2 small
    neox = {
        "model_type": "gpt_neox",
        "vocab_size": 50304,
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 8192,
        "max_position_embeddings": 2048,
    }
    c = load_model_config(_write(tmp_path, neox))
    assert c.position == "rope" and not c.tie_embeddings


def test_unsupported_hf_family_is_a_clear_error(tmp_path):
    f = _write(tmp_path, {"model_type": "t5"})
    with pytest.raises(SpecError, match="unsupported model_type 't5'") as e:
        load_model_config(f)
    assert e.value.file == str(f)


def test_seq_len_beyond_model_is_rejected():
    with pytest.raises(SpecError, match="exceeds the model's max_seq_len 2048"):
        load_model("gpt3-1.3b", 4096)


@pytest.mark.parametrize("name", ["gpt3-1.3b", "llama3-8b", "sandwich"])
def test_half_unit_layer_list_splits_each_block_into_parts_that_add_up(name):
    if name == "sandwich":  # Gemma-2's norms after attention and MLP: one more per half
        config = PRESETS["tiny-llama"].model_copy(update={"sandwich_norm": True})
        spec = ModelSpec(config=config, seq_len=64)
    else:
        spec = load_model(name, 1024)
    assert len(spec.layers) == spec.layer_list_len  # cached: the half-unit copy builds its own
    halves = spec.with_unit("half")
    c = halves.config
    assert halves.layer_list_len == 2 * c.num_layers + 2 == c.head_index + 1
    kinds = [layer.kind for layer in halves.layers]
    assert kinds == ["embedding"] + ["attention", "mlp"] * c.num_layers + ["head"]
    assert [c.layer_kind(i) for i in range(c.layer_list_len)] == kinds
    assert [c.block_of(i) for i in (1, 2, 3, 2 * c.num_layers)] == [0, 0, 1, c.num_layers - 1]
    block, (attn, mlp) = spec.layers[1], halves.layers[1:3]
    assert block == spec.block_layer == halves.block_layer
    for field in ("params", "fwd_flops_per_token", "saved_bytes_per_sample"):
        assert getattr(attn, field) + getattr(mlp, field) == getattr(block, field)
    assert attn.send_bytes_per_sample == mlp.send_bytes_per_sample == block.send_bytes_per_sample
    assert halves.total_params == spec.total_params
    # boundaries: block-unit position b is half-unit position 2b - 1 and back
    for b in range(spec.layer_list_len + 1):
        assert c.in_blocks(c.in_halves(b)) == b
    assert c.in_halves(spec.layer_list_len) == c.layer_list_len


def test_half_unit_refuses_parallel_residual_blocks():
    fields = {**PRESETS["gpt3-1.3b"].model_dump(), "parallel_residual": True}
    with pytest.raises(ValueError, match="parallel_residual"):
        type(PRESETS["gpt3-1.3b"]).model_validate({**fields, "layer_unit": "half"})
