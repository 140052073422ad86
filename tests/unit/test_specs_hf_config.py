"""Hugging Face config import: each key is read, known to be inert, or refused with one line that
names the file and the key; export writes configs that read back to the same model."""

from __future__ import annotations

import json

import pytest

from hetpp.specs import PRESETS
from hetpp.specs.errors import SpecError
from hetpp.specs.hf_config import from_hf, to_hf
from hetpp.specs.model import ModelConfig
from hetpp.specs.presets import load_model_config

LLAMA = {
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
}


def _load(tmp_path, **changes):
    cfg = {k: v for k, v in {**LLAMA, **changes}.items() if v is not ...}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return load_model_config(tmp_path)  # a model folder, as --model DIR


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings", "expected true or false"),
        ({"num_key_value_heads": 0}, "num_key_value_heads", "positive integer"),
        ({"hidden_size": "64"}, "hidden_size", "positive integer"),
        ({"rms_norm_eps": "1e-5"}, "rms_norm_eps", "expected a number"),
        ({"rope_theta": True}, "rope_theta", "expected a number"),
        ({"hidden_act": "gelu_fast"}, "hidden_act", "not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type", "yarn"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2, "beta": 1}}, "rope_scaling.beta",
         "not supported"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.low_freq_factor",
         "missing"),
        ({"mystery_option": 3}, "mystery_option", "not supported by hetpp"),
        ({"initializer_range": "small"}, "initializer_range", "expected a number"),
        ({"hidden_size": ...}, "hidden_size", "missing"),
    ],
)  # fmt: skip
def test_bad_fields_are_refused_by_name(tmp_path, changes, field, message):
    with pytest.raises(SpecError, match=message) as e:
        _load(tmp_path, **changes)
    assert e.value.field == field
    assert e.value.file == str(tmp_path / "config.json")
    assert "\n" not in str(e.value)


def test_llama31_mistral_gemma2_and_neox_fields(tmp_path):
    c = _load(
        tmp_path,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=False,
    )  # fmt: skip
    assert c.rope_scaling.type == "llama3" and c.rope_scaling.original_max_seq_len == 8192
    assert _load(tmp_path, initializer_range=0.01).init_std == 0.01  # random init follows it
    mistral = _load(tmp_path, model_type="mistral")
    assert mistral.sliding_window == 4096 and mistral.sliding_layers == "all"
    assert _load(tmp_path, model_type="mistral", sliding_window=None).sliding_window is None
    gemma = _load(tmp_path, model_type="gemma2", head_dim=32, query_pre_attn_scalar=32)
    assert (gemma.attn_head_dim, gemma.sliding_layers, gemma.tie_embeddings) == (32, "even", True)
    assert gemma.attn_scale == pytest.approx(32**-0.5) and gemma.final_logit_softcap == 30.0
    neox = {
        "model_type": "gpt_neox",
        "vocab_size": 128,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
    }
    (tmp_path / "config.json").write_text(json.dumps(neox))
    c = load_model_config(tmp_path / "config.json")
    assert c.parallel_residual and c.rotary_fraction == 0.25 and c.rotary_dim == 4


def test_refused_qwen2_sliding_window(tmp_path):
    with pytest.raises(SpecError, match="use_sliding_window"):
        _load(tmp_path, model_type="qwen2", use_sliding_window=True)


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_export_as_configs_that_read_back(name):
    c = PRESETS[name]
    family = "gpt2" if c.family == "gpt" else "llama"
    back = ModelConfig(**from_hf(to_hf(c, family), c.name))
    assert back.resolved().model_copy(update={"hf_model_type": None}) == c.resolved()


def test_a_model_a_family_cannot_express_is_refused():
    c = PRESETS["tiny-llama"].model_copy(update={"parallel_residual": True})
    with pytest.raises(SpecError, match="cannot be written as llama: parallel_residual"):
        to_hf(c, "llama")


def test_a_config_file_is_named_after_itself_and_a_folder_after_the_folder(tmp_path):
    cfg = json.dumps(LLAMA)  # no _name_or_path: the name comes from the path
    (tmp_path / "my-llama.json").write_text(cfg)
    assert load_model_config(tmp_path / "my-llama.json").name == "my-llama"
    folder = tmp_path / "llama-folder"
    folder.mkdir()
    (folder / "config.json").write_text(cfg)
    assert load_model_config(folder).name == "llama-folder"
