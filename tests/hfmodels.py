"""Tiny random Hugging Face models built in the test (nothing downloaded), one per family, each
exercising the family's peculiarities, and transformers' forward as the reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

transformers = pytest.importorskip("transformers")

_COMMON = dict(
    vocab_size=67,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_LLAMA = dict(
    _COMMON,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
)
_NEOX = dict(
    _COMMON,
    model_type="gpt_neox",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
)
CONFIGS: dict[str, dict] = {
    # Llama-3.1's rope_scaling, with an original context short enough to bend these frequencies.
    "llama": dict(
        _LLAMA,
        model_type="llama",
        rope_theta=5e5,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8,
        ),
        attention_bias=True,
        mlp_bias=True,
    ),
    "mistral": dict(_LLAMA, model_type="mistral", sliding_window=5, head_dim=16),
    "qwen2": dict(_LLAMA, model_type="qwen2", tie_word_embeddings=True),
    "phi3": dict(_LLAMA, model_type="phi3", partial_rotary_factor=0.5, sliding_window=6),
    "gemma2": dict(
        _LLAMA,
        model_type="gemma2",
        head_dim=16,
        query_pre_attn_scalar=12,
        attn_logit_softcapping=1.5,  # small caps so the tanh really bends these logits
        final_logit_softcapping=2.0,
        sliding_window=4,
        tie_word_embeddings=True,
    ),
    "gpt2": dict(
        model_type="gpt2",
        vocab_size=67,
        n_positions=64,
        n_embd=32,
        n_layer=3,
        n_head=4,
        eos_token_id=2,
        bos_token_id=1,
    ),
    "gpt_neox": dict(_NEOX, rotary_pct=0.25, rotary_emb_base=1e4),
    "gpt_neox-sequential": dict(_NEOX, use_parallel_residual=False, rotary_pct=0.5),
}


def hf_config(name: str):
    cfg = dict(CONFIGS[name])
    return transformers.CONFIG_MAPPING[cfg.pop("model_type")](**cfg)


def make_hf_model(name: str, folder: Path, seed: int = 0):
    """A random fp32 model of family `name` saved to `folder` (config.json + model.safetensors).
    Every parameter is perturbed, so a norm read into the wrong place changes the output."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        hf_config(name), attn_implementation="eager"
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    return model


class Float64Everywhere(TorchFunctionMode):
    """transformers computes RMSNorm, rotary angles and eager softmax in float32 even for a
    float64 model (and Gemma's embedding scale is a float32 constant); inside this mode every
    float32 request is float64, so the reference is the same model code with no float32 step
    (what hetpp's float64 computes)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.float:
            return args[0].double()
        swap = lambda v: torch.float64 if v is torch.float32 else v  # noqa: E731
        return func(*map(swap, args), **{k: swap(v) for k, v in (kwargs or {}).items()})


def reference_model(name: str, fp32_model, dtype: torch.dtype):
    """transformers' model in `dtype` with the weights of `fp32_model`."""
    if dtype == torch.float32:
        return fp32_model.eval()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # buffers made by torch.tensor(x): Gemma's embed_scale
    try:
        with Float64Everywhere():
            model = transformers.AutoModelForCausalLM.from_config(
                hf_config(name), attn_implementation="eager"
            )
    finally:
        torch.set_default_dtype(default)
    model = model.to(dtype)
    model.load_state_dict(fp32_model.state_dict())
    return model.eval()


def reference_forward(model, tokens: torch.Tensor, dtype: torch.dtype):
    """(logits of tokens[:, :-1], mean loss of predicting tokens[:, 1:]) from transformers."""
    if dtype == torch.float64:
        with Float64Everywhere(), torch.no_grad():
            out = model(tokens, labels=tokens)
    else:
        with torch.no_grad():
            out = model(tokens, labels=tokens)
    return out.logits[:, :-1], out.loss
