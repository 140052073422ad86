"""Model specs: an architecture config, and the per-layer list the cost model reads.

A model is embedding, `num_layers` transformer blocks, then head (final norm + LM head + loss),
so layer index 0 is the embedding and index `num_layers + 1` the head. Stages own `[start, end)`
ranges of that list. Byte counts assume the activation dtype of `dtype_bytes` and
`scaled_dot_product_attention` (flash/memory-efficient kernels keep no seq x seq scores).
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from hetpp.specs.limits import MAX_LAYERS

LayerKind = Literal["embedding", "block", "head"]


class ModelConfig(BaseModel):
    """Architecture of a decoder-only transformer (GPT or Llama family)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = "custom"
    """Preset or checkpoint name, shown in reports."""
    family: Literal["gpt", "llama"]
    """gpt: LayerNorm + GELU MLP + biases; llama: RMSNorm + SwiGLU, no dense biases."""
    vocab_size: PositiveInt
    hidden_size: PositiveInt
    num_layers: PositiveInt = Field(le=MAX_LAYERS)
    """Transformer blocks (at most `limits.MAX_LAYERS`)."""
    num_heads: PositiveInt
    num_kv_heads: PositiveInt | None = None
    """Grouped-query attention; None means `num_heads` (multi-head attention)."""
    ffn_hidden_size: PositiveInt
    max_seq_len: PositiveInt = 2048
    position: Literal["learned", "rope"] = "learned"
    """Learned absolute positions (GPT-2/3) or rotary embeddings (Llama, NeoX)."""
    qkv_bias: bool = True
    dense_bias: bool = True
    """Bias on attention output and MLP projections."""
    tie_embeddings: bool = False
    """Head reuses the embedding matrix (GPT-2/3)."""
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @model_validator(mode="after")
    def _shapes(self) -> ModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class LayerSpec(BaseModel):
    """One entry of the model's layer list, at a fixed sequence length."""

    model_config = ConfigDict(frozen=True)

    index: int
    kind: LayerKind
    params: int
    """Parameters this layer adds to the model (tied weights counted once, at the embedding)."""
    stored_params: int
    """Parameters the rank holding this layer stores (a tied head stores its own copy)."""
    fwd_flops_per_token: float
    """Forward FLOPs per token (multiply-add = 2); backward is about twice this."""
    send_bytes_per_sample: int
    """Activation sent to the next layer, per sequence."""
    saved_bytes_per_sample: int
    """Activation kept from forward until backward, per sequence, without recomputation."""
    saved_bytes_recompute_per_sample: int
    """The same with full activation recomputation (only the layer input is kept)."""


class ModelSpec(BaseModel):
    """A model at a sequence length: its config and per-layer costs."""

    model_config = ConfigDict(frozen=True)

    config: ModelConfig
    seq_len: PositiveInt
    dtype_bytes: int = Field(2, ge=1, le=8)
    """Bytes per activation/weight element (2 for bf16/fp16, 4 for fp32)."""

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def num_layers(self) -> int:
        """Length of the layer list: blocks + embedding + head."""
        return self.config.num_layers + 2

    @cached_property
    def layers(self) -> tuple[LayerSpec, ...]:
        c, s, d = self.config, self.seq_len, self.dtype_bytes
        emb, block, head = _embedding(c, s, d), _block(c, s, d), _head(c, s, d)
        out = [LayerSpec(index=0, **emb)]
        out += [LayerSpec(index=i + 1, **block) for i in range(c.num_layers)]
        out.append(LayerSpec(index=c.num_layers + 1, **head))
        return tuple(out)

    @property
    def total_params(self) -> int:
        return sum(layer.params for layer in self.layers)


def _norm_params(c: ModelConfig) -> int:
    return 2 * c.hidden_size if c.family == "gpt" else c.hidden_size


def block_params(c: ModelConfig) -> int:
    """Parameters of one transformer block."""
    h, f, kvd = c.hidden_size, c.ffn_hidden_size, c.kv_heads * c.head_dim
    qkv = h * (h + 2 * kvd) + (h + 2 * kvd if c.qkv_bias else 0)
    out = h * h + (h if c.dense_bias else 0)
    mlp = 2 * h * f + (f + h if c.dense_bias else 0) if c.family == "gpt" else 3 * h * f
    return qkv + out + mlp + 2 * _norm_params(c)


def _block(c: ModelConfig, s: int, d: int) -> dict:
    h, f, kvd = c.hidden_size, c.ffn_hidden_size, c.kv_heads * c.head_dim
    matmul = h * (h + 2 * kvd) + h * h + (2 if c.family == "gpt" else 3) * h * f
    attn = 4 * s * h  # QK^T and AV over the full (unmasked) sequence, per token
    kv_frac = kvd / h
    if c.family == "gpt":
        # norm in/out x2, q/k/v, attention out; MLP in, activation in, activation out.
        saved_elems = h * (2 + 2 + 1 + 2 * kv_frac + 1) + 2 * f
    else:
        # as GPT plus rotated q/k, fp32 RMSNorm upcasts (2 elements each), SwiGLU gate/up/act/prod.
        saved_elems = h * (2 + 2 + 1 + 2 * kv_frac + 1 + 1 + kv_frac + 2 * 2) + 4 * f
    n = block_params(c)
    return dict(
        kind="block",
        params=n,
        stored_params=n,
        fwd_flops_per_token=2.0 * matmul + attn,
        send_bytes_per_sample=s * h * d,
        saved_bytes_per_sample=int(s * saved_elems * d),
        saved_bytes_recompute_per_sample=s * h * d,
    )


def _embedding(c: ModelConfig, s: int, d: int) -> dict:
    n = c.vocab_size * c.hidden_size + (
        c.max_seq_len * c.hidden_size if c.position == "learned" else 0
    )
    return dict(
        kind="embedding",
        params=n,
        stored_params=n,
        fwd_flops_per_token=0.0,
        send_bytes_per_sample=s * c.hidden_size * d,
        saved_bytes_per_sample=s * 8,  # token ids (int64)
        saved_bytes_recompute_per_sample=s * 8,
    )


def _head(c: ModelConfig, s: int, d: int) -> dict:
    h, v = c.hidden_size, c.vocab_size
    own = _norm_params(c) + (0 if c.tie_embeddings else v * h)
    # norm input and output, and the logits (the loss keeps them for its backward).
    saved = s * (2 * h + v) * d
    return dict(
        kind="head",
        params=own,
        stored_params=_norm_params(c) + v * h,
        fwd_flops_per_token=2.0 * h * v,
        send_bytes_per_sample=4,  # the scalar loss
        saved_bytes_per_sample=saved,
        saved_bytes_recompute_per_sample=saved,
    )
