"""Hugging Face `config.json` to ModelConfig and back.

Every key of a config is read into a ModelConfig field, listed in INERT (it changes nothing hetpp
computes), or refused with a SpecError naming it: none is ignored silently. Values are type-checked
here, under their Hugging Face names, so an error names the key the user wrote.
Both spellings transformers reads are accepted: `rope_theta` / `rope_scaling` (4.x and the Hub) and
`rope_parameters` (5.x); export writes the 4.x spelling, which 5.x upgrades on load.
"""

from __future__ import annotations

from typing import Any

from hetpp.specs.errors import SpecError
from hetpp.specs.model import ModelConfig

FAMILIES = ("llama", "mistral", "qwen2", "phi3", "gemma2", "gpt2", "gpt_neox")
LLAMA_LIKE = ("llama", "mistral", "qwen2", "phi3", "gemma2")

INERT = frozenset(
    {
        # metadata, tokens, generation and caching
        "architectures",
        "model_type",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "_name_or_path",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "use_cache",
        "is_decoder",
        "cache_implementation",
        "n_ctx",
        "task_specific_params",
        "id2label",
        "label2id",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "pretraining_tp",  # transformers 5 no longer reads it: one unsplit projection
        # dropout: hetpp trains without dropout (documented in the README)
        "attention_dropout",
        "hidden_dropout",
        "classifier_dropout",
        "resid_pdrop",
        "embd_pdrop",
        "attn_pdrop",
        "summary_first_dropout",
        # GPT-2's sequence-summary head, unused by the language model
        "summary_type",
        "summary_use_proj",
        "summary_activation",
        "summary_proj_to_labels",
    }
)

_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
_DEFAULT_MAX_POS = {
    "llama": 2048,
    "mistral": 131072,
    "qwen2": 32768,
    "phi3": 4096,
    "gemma2": 8192,
    "gpt2": 1024,
    "gpt_neox": 2048,
}
_REQUIRED = object()


class _Reader:
    """Typed access to a config dict that remembers which keys were read."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg, self.used = cfg, set(INERT)

    def _get(self, key: str, default: Any) -> Any:
        self.used.add(key)
        value = self.cfg.get(key)
        if value is None:
            if default is _REQUIRED:
                raise SpecError("required field is missing", field=key)
            return default
        return value

    def int(self, key: str, default: Any = _REQUIRED) -> Any:
        v = self._get(key, default)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise SpecError(f"expected a positive integer, got {v!r}", field=key)
        return v

    def float(self, key: str, default: Any = _REQUIRED) -> Any:
        v = self._get(key, default)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise SpecError(f"expected a number, got {v!r}", field=key)
        return None if v is None else float(v)

    def bool(self, key: str, default: bool) -> bool:
        v = self._get(key, default)
        if not isinstance(v, bool):
            raise SpecError(f"expected true or false, got {v!r}", field=key)
        return v

    def act(self, key: str, default: str) -> str:
        v = self._get(key, default)
        if v not in _ACTIVATIONS:
            raise SpecError(
                f"activation {v!r} not supported; expected one of {', '.join(_ACTIVATIONS)}",
                field=key,
            )
        return _ACTIVATIONS[v]

    def refuse_unless(self, key: str, allowed: Any, why: str) -> None:
        """Read `key`, which must be absent or equal `allowed`."""
        v = self._get(key, None)
        if v is not None and v != allowed:
            raise SpecError(f"{v!r} is not supported: {why}", field=key)

    def nullable(self, default: Any, key: str) -> Any:
        """`default` when `key` is absent, None when it is written as null (no window, no cap)."""
        return default if key not in self.cfg else None

    def check_all_read(self) -> None:
        unknown = sorted(set(self.cfg) - self.used)
        if unknown:
            raise SpecError(
                "field not supported by hetpp (it would change the model)", field=unknown[0]
            )


def from_hf(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """ModelConfig fields for a Hugging Face config dict; SpecError names a bad or unknown key."""
    mt = cfg.get("model_type")
    if mt not in FAMILIES:
        raise SpecError(
            f"unsupported model_type {mt!r}; expected one of {', '.join(FAMILIES)}",
            field="model_type",
        )
    r = _Reader(cfg)
    fields = {
        "init_std": r.float("initializer_range", 0.02),
        "name": name,
        "hf_model_type": mt,
        "max_seq_len": r.int(
            "n_positions" if mt == "gpt2" else "max_position_embeddings", _DEFAULT_MAX_POS[mt]
        ),
    }
    fields |= _gpt2(r) if mt == "gpt2" else _neox(r) if mt == "gpt_neox" else _llama_like(r, mt)
    if fields.get("position") == "rope":
        fields |= _rope(r, mt)
    r.check_all_read()
    return fields


def _gpt2(r: _Reader) -> dict[str, Any]:
    r.refuse_unless("scale_attn_by_inverse_layer_idx", False, "per-layer attention scaling")
    r.refuse_unless("reorder_and_upcast_attn", False, "fp32 attention upcast is not implemented")
    r.refuse_unless("add_cross_attention", False, "hetpp builds decoder-only models")
    h = r.int("n_embd")
    return dict(
        family="gpt",
        vocab_size=r.int("vocab_size"),
        hidden_size=h,
        num_layers=r.int("n_layer"),
        num_heads=r.int("n_head"),
        ffn_hidden_size=r.int("n_inner", 4 * h),
        activation=r.act("activation_function", "gelu_new"),
        tie_embeddings=r.bool("tie_word_embeddings", True),
        norm_eps=r.float("layer_norm_epsilon", 1e-5),
        attn_scale=None if r.bool("scale_attn_weights", True) else 1.0,
    )


def _neox(r: _Reader) -> dict[str, Any]:
    bias = r.bool("attention_bias", True)
    return dict(
        family="gpt",
        vocab_size=r.int("vocab_size"),
        hidden_size=r.int("hidden_size"),
        num_layers=r.int("num_hidden_layers"),
        num_heads=r.int("num_attention_heads"),
        ffn_hidden_size=r.int("intermediate_size"),
        activation=r.act("hidden_act", "gelu"),
        position="rope",
        qkv_bias=bias,
        dense_bias=bias,
        mlp_bias=True,
        parallel_residual=r.bool("use_parallel_residual", True),
        tie_embeddings=r.bool("tie_word_embeddings", False),
        norm_eps=r.float("layer_norm_eps", 1e-5),
    )


def _llama_like(r: _Reader, mt: str) -> dict[str, Any]:
    heads = r.int("num_attention_heads")
    bias = r.bool("attention_bias", False) if mt in ("llama", "gemma2") else False
    gemma = mt == "gemma2"
    out = dict(
        family="llama",
        vocab_size=r.int("vocab_size"),
        hidden_size=r.int("hidden_size"),
        num_layers=r.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=r.int("num_key_value_heads", heads),
        ffn_hidden_size=r.int("intermediate_size"),
        attn_head_dim=r.int("head_dim", None),
        position="rope",
        qkv_bias=bias or mt == "qwen2",
        dense_bias=bias,
        mlp_bias=r.bool("mlp_bias", False) if mt == "llama" else False,
        activation=r.act(
            "hidden_activation" if gemma else "hidden_act", "gelu_pytorch_tanh" if gemma else "silu"
        ),
        tie_embeddings=r.bool("tie_word_embeddings", gemma),
        norm_eps=r.float("rms_norm_eps", 1e-5 if mt == "phi3" else 1e-6),
    )
    out |= _sliding(r, mt, out["num_layers"])
    if gemma:
        r.refuse_unless("use_bidirectional_attention", False, "hetpp trains causal models")
        out |= dict(
            attn_scale=r.float("query_pre_attn_scalar", 256) ** -0.5,
            attn_logit_softcap=r.float(a := "attn_logit_softcapping", r.nullable(50.0, a)),
            final_logit_softcap=r.float(f := "final_logit_softcapping", r.nullable(30.0, f)),
            sandwich_norm=True,
            norm_unit_offset=True,
            scale_embeddings=True,
        )
    return out


def _sliding(r: _Reader, mt: str, layers: int) -> dict[str, Any]:
    if mt == "qwen2":
        r.refuse_unless("use_sliding_window", False, "Qwen2's per-layer sliding window")
        r.int("sliding_window", None)  # both inert while use_sliding_window is off
        r.int("max_window_layers", None)
        r.refuse_unless("layer_types", ["full_attention"] * layers, "Qwen2 sliding layers")
        return {}
    if mt == "llama":
        return {}
    # Absent means the family's default; null means no window (Mistral v0.2 and later).
    key = "sliding_window"
    window = r.int(key, r.nullable({"mistral": 4096, "gemma2": 4096}.get(mt), key))
    pattern = "even" if mt == "gemma2" else "all"
    if window is not None:
        kinds = {
            "all": ["sliding_attention"] * layers,
            "even": ["full_attention" if i % 2 else "sliding_attention" for i in range(layers)],
        }
        r.refuse_unless("layer_types", kinds[pattern], f"hetpp supports {pattern} layers sliding")
    else:
        r.refuse_unless("layer_types", ["full_attention"] * layers, "no sliding_window is set")
    return dict(sliding_window=window, sliding_layers=pattern)


def _rope(r: _Reader, mt: str) -> dict[str, Any]:
    """rope_theta, rotary_fraction and rope_scaling from either spelling."""
    params = r._get("rope_parameters", None)
    if params is not None and not isinstance(params, dict):
        raise SpecError(f"expected a mapping, got {params!r}", field="rope_parameters")
    if params is None:
        theta_key = "rotary_emb_base" if mt == "gpt_neox" else "rope_theta"
        frac_key = "rotary_pct" if mt == "gpt_neox" else "partial_rotary_factor"
        theta = r.float(theta_key, 10000.0)
        frac = r.float(frac_key, 0.25 if mt == "gpt_neox" else 1.0)
        scaling = r._get("rope_scaling", None)
    else:
        sub = _Reader(params)
        theta = sub.float("rope_theta", 10000.0)
        frac = sub.float("partial_rotary_factor", 0.25 if mt == "gpt_neox" else 1.0)
        scaling = {
            k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")
        }
        # transformers 5 also writes these two at the top level: they must agree.
        for key, value in (("rope_theta", theta), ("partial_rotary_factor", frac)):
            if r.float(key, value) != value:
                raise SpecError(f"disagrees with rope_parameters.{key} ({value})", field=key)
    if mt == "phi3":
        r.int("original_max_position_embeddings", None)  # read by longrope only, refused below
    return dict(rope_theta=theta, rotary_fraction=frac, rope_scaling=_rope_scaling(scaling))


def _rope_scaling(scaling: Any) -> dict[str, Any] | None:
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise SpecError(f"expected a mapping, got {scaling!r}", field="rope_scaling")
    try:
        return _read_rope_scaling(_Reader(scaling))
    except SpecError as e:
        raise SpecError(e.message, field=f"rope_scaling.{e.field}") from None


def _read_rope_scaling(r: _Reader) -> dict[str, Any] | None:
    kind = r._get("rope_type", None) or r._get("type", "default")
    if kind == "default":
        r.check_all_read()
        return None
    if kind not in ("linear", "llama3"):
        raise SpecError(
            f"rope type {kind!r} not supported; expected default, linear or llama3 "
            "(dynamic, yarn and longrope change with the sequence length)",
            field="rope_type",
        )
    out = dict(type=kind, factor=r.float("factor"))
    if kind == "llama3":
        out |= dict(
            low_freq_factor=r.float("low_freq_factor"),
            high_freq_factor=r.float("high_freq_factor"),
            original_max_seq_len=r.int("original_max_position_embeddings"),
        )
    r.check_all_read()
    return out


_ACT_NAMES = {"silu": "silu", "gelu": "gelu", "relu": "relu"}
_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gpt_neox": "GPTNeoXForCausalLM",
}


def to_hf(c: ModelConfig, family: str) -> dict[str, Any]:
    """A `config.json` dict of `family` for `c`; SpecError when that family cannot express `c`
    (checked by reading the result back)."""
    act = _ACT_NAMES.get(c.act) or ("gelu_new" if family == "gpt2" else "gelu_pytorch_tanh")
    cfg: dict[str, Any] = {
        "model_type": family,
        "architectures": [_ARCH[family]],
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": c.tie_embeddings,
        "initializer_range": c.init_std,
        # hetpp keeps no token ids; a family default outside the vocabulary (Phi-3's pad 32000)
        # would stop transformers from building the embedding.
        "pad_token_id": None,
    }
    if family == "gpt2":
        cfg |= dict(
            n_embd=c.hidden_size,
            n_layer=c.num_layers,
            n_head=c.num_heads,
            n_inner=c.ffn_hidden_size,
            n_positions=c.max_seq_len,
            activation_function=act,
            layer_norm_epsilon=c.norm_eps,
            scale_attn_weights=c.attn_scale is None,
        )
    else:
        cfg |= dict(
            hidden_size=c.hidden_size,
            num_hidden_layers=c.num_layers,
            num_attention_heads=c.num_heads,
            intermediate_size=c.ffn_hidden_size,
            max_position_embeddings=c.max_seq_len,
        )
        cfg |= _rope_to_hf(c, family)
    if family == "gpt_neox":
        cfg |= dict(
            hidden_act=act,
            layer_norm_eps=c.norm_eps,
            attention_bias=c.qkv_bias,
            use_parallel_residual=c.parallel_residual,
        )
    elif family in LLAMA_LIKE:
        cfg |= dict(num_key_value_heads=c.kv_heads, head_dim=c.head_dim, rms_norm_eps=c.norm_eps)
        cfg["hidden_activation" if family == "gemma2" else "hidden_act"] = act
        if family in ("llama", "gemma2"):
            cfg["attention_bias"] = c.qkv_bias
        if family == "llama":
            cfg["mlp_bias"] = c.has_mlp_bias
        if family in ("mistral", "phi3", "gemma2"):
            cfg["sliding_window"] = c.sliding_window
    if family == "gemma2":
        cfg |= dict(
            query_pre_attn_scalar=_scalar((c.attn_scale or c.head_dim**-0.5) ** -2),
            attn_logit_softcapping=c.attn_logit_softcap,
            final_logit_softcapping=c.final_logit_softcap,
        )
    key = c.first_difference(ModelConfig(**from_hf(cfg, c.name)))
    if key is not None:
        raise SpecError(f"model {c.name} cannot be written as {family}: {key} differs", field=key)
    return cfg


def _scalar(x: float) -> float | int:
    """An integer when x is one up to rounding (transformers types query_pre_attn_scalar int)."""
    return round(x) if abs(x - round(x)) < 1e-9 * max(1.0, abs(x)) else x


def _rope_to_hf(c: ModelConfig, family: str) -> dict[str, Any]:
    rs = c.rope_scaling
    scaling = None if rs is None else {"rope_type": rs.type, "factor": rs.factor}
    if rs is not None and rs.type == "llama3":
        scaling |= dict(
            low_freq_factor=rs.low_freq_factor,
            high_freq_factor=rs.high_freq_factor,
            original_max_position_embeddings=rs.original_max_seq_len,
        )
    if family == "gpt_neox":
        return dict(
            rotary_emb_base=c.rope_theta, rotary_pct=c.rotary_fraction, rope_scaling=scaling
        )
    out = dict(rope_theta=c.rope_theta, rope_scaling=scaling)
    if c.rotary_fraction != 1.0:
        out["partial_rotary_factor"] = c.rotary_fraction
    return out
