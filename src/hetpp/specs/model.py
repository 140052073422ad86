"""Model specs: an architecture config, and the per-layer list the cost model reads.

A model is embedding, `num_layers` transformer blocks, then head (final norm + LM head + loss),
so layer index 0 is the embedding and the last index (`ModelConfig.head_index`) the head; with
`layer_unit: half` each block is two entries, its attention half and its MLP half. Stages own
`[start, end)` ranges of that list. Byte counts assume the activation dtype of `dtype_bytes` and
`scaled_dot_product_attention` (flash/memory-efficient kernels keep no seq x seq scores).
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from hetpp.specs.limits import MAX_LAYERS

LayerKind = Literal["embedding", "block", "attention", "mlp", "head"]
LayerUnit = Literal["block", "half"]
BLOCK_KINDS = ("block", "attention", "mlp")
"""The kinds that are a transformer block or a half of one (what TP splits and recomputation
runs again)."""
Activation = Literal["gelu_tanh", "gelu", "silu", "relu"]
HfModelType = Literal["llama", "mistral", "qwen2", "gpt2", "gpt_neox", "phi3", "gemma2"]


class RopeScaling(BaseModel):
    """Rotary frequency scaling for long contexts (the `rope_scaling` of a Hugging Face config)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["linear", "llama3"]
    """linear: every frequency divided by `factor`; llama3: Llama-3.1's banded scaling."""
    factor: PositiveFloat
    low_freq_factor: PositiveFloat = 1.0
    """llama3 only: wavelengths above original_max_seq_len / low_freq_factor are scaled fully."""
    high_freq_factor: PositiveFloat = 4.0
    """llama3 only: wavelengths below original_max_seq_len / high_freq_factor are kept."""
    original_max_seq_len: PositiveInt = 8192
    """llama3 only: the context length the model was pre-trained at."""


class ModelConfig(BaseModel):
    """Architecture of a decoder-only transformer (GPT or Llama family, and the variations of the
    Hugging Face families hetpp supports: parallel residual, partial rotary, sliding windows,
    soft-capping, sandwich norms)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = "custom"
    """Preset or checkpoint name, shown in reports."""
    family: Literal["gpt", "llama"]
    """gpt: LayerNorm + GELU MLP + biases; llama: RMSNorm + SwiGLU, no dense biases."""
    vocab_size: PositiveInt
    vocab_multiple: PositiveInt = 128
    """The embedding and the LM head are built with the vocabulary rounded up to a multiple of
    this (`padded_vocab`), as Megatron-LM pads it: an odd vocabulary like GPT-2's 50257 misses
    the tensor-core GEMM tiles (the shipped H200 head measurement ran at 11-13% of peak). The
    padding rows are never looked up and their logits are left out of the loss. 1: no padding."""
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
    mlp_bias: bool | None = None
    """Bias on the MLP projections; None means the same as `dense_bias`."""
    activation: Activation | None = None
    """MLP activation; None means the family's (gpt: gelu_tanh, llama: silu, gated)."""
    attn_head_dim: PositiveInt | None = None
    """Width of one attention head when it is not hidden_size / num_heads (Gemma)."""
    attn_scale: PositiveFloat | None = None
    """Factor on the attention scores; None means 1/sqrt(head_dim)."""
    rotary_fraction: float = Field(1.0, gt=0.0, le=1.0)
    """Share of each head's dimensions that is rotated (GPT-NeoX's `rotary_pct`)."""
    rope_scaling: RopeScaling | None = None
    sliding_window: PositiveInt | None = None
    """Sliding-window attention: a token sees itself and the `sliding_window - 1` before it."""
    sliding_layers: Literal["all", "even"] = "all"
    """Blocks with the sliding window: all (Mistral), or every other from the first (Gemma-2)."""
    parallel_residual: bool = False
    """x + attn(norm1(x)) + mlp(norm2(x)) (GPT-NeoX) instead of two residual steps."""
    sandwich_norm: bool = False
    """Gemma-2: norms after attention and MLP too, before each residual add."""
    norm_unit_offset: bool = False
    """Gemma: RMSNorm scales by 1 + weight (weights start at 0)."""
    scale_embeddings: bool = False
    """Gemma: token embeddings multiplied by sqrt(hidden_size)."""
    attn_logit_softcap: PositiveFloat | None = None
    """Gemma-2: attention scores become cap * tanh(scores / cap)."""
    final_logit_softcap: PositiveFloat | None = None
    """Gemma-2: logits become cap * tanh(logits / cap)."""
    init_std: PositiveFloat = 0.02
    """Standard deviation of the random initial weights (projections into the residual stream
    get init_std / sqrt(2 * num_layers), as GPT-2); weights from --init-from replace them."""
    hf_model_type: HfModelType | None = None
    """The Hugging Face architecture this config came from (and is exported as)."""
    layer_unit: LayerUnit = "block"
    """How the layer list cuts the blocks (partitioning, not architecture: the same weights and
    the same training either way). "block": one entry per transformer block. "half": two, the
    attention half (norm, attention, residual add) and the MLP half (norm, MLP, residual add),
    so a stage may end mid-block and a slow device can hold half a block less than a whole one.
    Not with `parallel_residual` (both halves read the block's input)."""

    @model_validator(mode="after")
    def _shapes(self) -> ModelConfig:
        if self.attn_head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.position == "learned" and (self.rope_scaling or self.rotary_fraction != 1.0):
            raise ValueError("rope_scaling and rotary_fraction need position: rope")
        if self.rotary_dim % 2:
            raise ValueError("rotary_fraction * head_dim must be even")
        if self.layer_unit == "half" and self.parallel_residual:
            raise ValueError(
                "layer_unit half needs sequential residual blocks (parallel_residual: false)"
            )
        return self

    @property
    def layer_list_len(self) -> int:
        """Entries of the layer list: embedding, the blocks (two per block at `layer_unit`
        half), head."""
        return self.num_layers * (2 if self.layer_unit == "half" else 1) + 2

    @property
    def head_index(self) -> int:
        """Index of the head, the layer list's last entry."""
        return self.layer_list_len - 1

    def layer_kind(self, index: int) -> LayerKind:
        """What layer `index` of the layer list is."""
        if index == 0:
            return "embedding"
        if index == self.head_index:
            return "head"
        if self.layer_unit == "block":
            return "block"
        return "attention" if index % 2 else "mlp"

    def block_of(self, index: int) -> int:
        """The block (0-based among the blocks) that layer `index` is or is a half of."""
        return index - 1 if self.layer_unit == "block" else (index - 1) // 2

    def in_blocks(self, index: int) -> int:
        """Boundary `index` of this layer list (a stage's start or end) in the block-unit one,
        rounded down where it falls mid-block; for a layer's own index (its start), the index
        of it, or of the block it halves, in the block-unit list."""
        if self.layer_unit == "block" or index == 0:
            return index
        return self.num_layers + 2 if index == self.layer_list_len else (index + 1) // 2

    def in_halves(self, index: int) -> int:
        """Boundary `index` of the block-unit layer list in the half-unit one: block b starts
        at its attention half, the end of the list stays its end."""
        if index == 0:
            return 0
        return 2 * self.num_layers + 2 if index == self.num_layers + 2 else 2 * index - 1

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding and LM head matrices: `vocab_size` rounded up to
        `vocab_multiple`."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def vocab_padding_rows(self) -> int:
        return self.padded_vocab - self.vocab_size

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        """Width of all query heads together (hidden_size unless `attn_head_dim` is set)."""
        return self.num_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that are rotated (as transformers rounds: down)."""
        return int(self.head_dim * self.rotary_fraction)

    @property
    def gated(self) -> bool:
        """Gated MLP (SwiGLU / GeGLU): the llama family."""
        return self.family == "llama"

    @property
    def act(self) -> Activation:
        return self.activation or ("silu" if self.gated else "gelu_tanh")

    @property
    def has_mlp_bias(self) -> bool:
        return self.dense_bias if self.mlp_bias is None else self.mlp_bias

    def resolved(self) -> ModelConfig:
        """The same model with every None-means-derived field written out, so two configs of one
        architecture compare equal however they were spelt."""
        return self.model_copy(
            update=dict(
                num_kv_heads=self.kv_heads,
                attn_head_dim=self.head_dim,
                activation=self.act,
                mlp_bias=self.has_mlp_bias,
                attn_scale=self.attn_scale or self.head_dim**-0.5,
            )
        )

    def first_difference(self, other: ModelConfig) -> str | None:
        """The first field in which two architectures differ (the name and origin aside)."""
        a, b = self.resolved(), other.resolved()
        for key in type(self).model_fields:
            if key in ("name", "hf_model_type", "layer_unit"):
                continue
            if getattr(a, key) != getattr(b, key):
                return key
        return None

    def is_sliding(self, block: int) -> bool:
        """Whether block `block` (0-based among the blocks) uses the sliding window."""
        return self.sliding_window is not None and (self.sliding_layers == "all" or block % 2 == 0)


class LayerSpec(BaseModel):
    """One entry of the model's layer list, at a fixed sequence length."""

    model_config = ConfigDict(frozen=True)

    index: int
    kind: LayerKind
    params: int
    """Parameters this layer adds to the model (tied weights counted once, at the embedding),
    as the runtime builds them: vocabulary padding rows included."""
    padding_params: int = 0
    """The part of `params` that is vocabulary padding (rows beyond `vocab_size`)."""
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
    params_whole_under_tp: int = 0
    """Of `params`, what every rank of a tensor-parallel group keeps whole: a block's norm
    weights and the biases of its row-parallel projections (added after the sum)."""
    saved_bytes_whole_under_tp_per_sample: int = 0
    """Of `saved_bytes_per_sample`, what every rank of a tensor-parallel group keeps whole
    (without sequence parallelism: the norms' inputs and outputs and their fp32 upcasts, on the
    replicated residual stream); the rest is split over the group (Korthikanti et al. 2022)."""
    weight_grad_input_bytes_per_sample: int = 0
    """What a split backward keeps per sequence from its input-grad part I to its weight-grad
    part W besides the saved activations: torch's `stage_backward_input` stores, per parameter
    group, the gradient flowing into each op that reads a weight (`param_group["grads"]`), that
    is each weighted op's output (a block's q, k, v, attention out, MLP projections and norms;
    the head's padded logits and final norm). The embedding has none: torch skips I on a
    pipeline's first stage (its W runs the whole backward)."""
    weight_grad_input_whole_under_tp_per_sample: int = 0
    """Of `weight_grad_input_bytes_per_sample`, what every tensor-parallel rank keeps whole: the
    outputs of the row-parallel projections (attention out, MLP down) and of the norms."""
    weight_grad_input_rms_norm_bytes_per_sample: int = 0
    """Of `weight_grad_input_bytes_per_sample`, the RMSNorm outputs' gradients (at the model's
    dtype): under autocast with float32 parameters (`TrainSpec.half_params` off) the float32
    weight times the half-precision normalised input promotes the output, and so its
    gradient, to float32, which `cost.compute` charges (measured: `hetpp train
    --memory-report`). LayerNorm (GPT) stays in the half type."""
    input_grad_frees_bytes_per_sample: int = 0
    """Of `saved_bytes_per_sample`, what a pipeline's last stage no longer keeps once a split
    backward's I has run: torch detaches the loss after it and drops its cache of the stage's
    output, so the head's logits and the loss's float32 log-probabilities go, while the
    final norm's tensors stay for the W (measured: `hetpp train --memory-report`)."""


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
    def layer_list_len(self) -> int:
        """Length of the layer list (`ModelConfig.layer_list_len`; `config.num_layers` counts the
        blocks only)."""
        return self.config.layer_list_len

    @cached_property
    def layers(self) -> tuple[LayerSpec, ...]:
        c, s, d = self.config, self.seq_len, self.dtype_bytes
        halves = _block_halves(c, s, d)
        blocks = halves if c.layer_unit == "half" else (_whole_block(*halves),)
        out = [_embedding(c, s, d), *blocks * c.num_layers, _head(c, s, d)]
        return tuple(LayerSpec(index=i, **layer) for i, layer in enumerate(out))

    @cached_property
    def block_layer(self) -> LayerSpec:
        """One whole transformer block (whatever `layer_unit`): measured and estimated block
        costs are per block, and a half's share of them is its share of the block's FLOPs."""
        c, s, d = self.config, self.seq_len, self.dtype_bytes
        return LayerSpec(index=1, **_whole_block(*_block_halves(c, s, d)))

    def with_unit(self, unit: LayerUnit) -> ModelSpec:
        """The same model with its layer list cut at `unit`."""
        config = self.config.model_copy(update={"layer_unit": unit})
        # built anew: `model_copy` would carry the cached `layers` over
        return ModelSpec(config=config, seq_len=self.seq_len, dtype_bytes=self.dtype_bytes)

    @property
    def total_params(self) -> int:
        """The model's parameter count (as published; vocabulary padding not counted)."""
        return sum(layer.params - layer.padding_params for layer in self.layers)

    @property
    def built_params(self) -> int:
        """Parameters the runtime builds (vocabulary padding included, tied weights once)."""
        return sum(layer.params for layer in self.layers)


def _norm_params(c: ModelConfig) -> int:
    return 2 * c.hidden_size if c.family == "gpt" else c.hidden_size


def block_params(c: ModelConfig) -> int:
    """Parameters of one transformer block."""
    return sum(half["params"] for half in _block_halves(c, 1, 1))


def _rms_upcast_bytes(c: ModelConfig, s: int) -> int:
    """What one RMSNorm keeps besides its input and output, per sequence: the normalised input
    in float32, whatever the precision (the norm computes in float32: a float32 copy of a half
    input, or `x * rsqrt(...)` of a float32 one); LayerNorm (GPT) keeps no such copy."""
    return 0 if c.family == "gpt" else s * c.hidden_size * 4


def _block_halves(c: ModelConfig, s: int, d: int) -> tuple[dict, dict]:
    """A block's attention half and MLP half (`layer_unit` half), each with what it owns, runs,
    keeps and sends; a whole block is their sum (`_whole_block`)."""
    h, f, q, kvd = c.hidden_size, c.ffn_hidden_size, c.q_dim, c.kv_heads * c.head_dim
    gates = 2 if c.gated else 1
    half_norms = 2 if c.sandwich_norm else 1  # per half: the pre-norm (and Gemma's post-norm)
    if c.family == "gpt":
        # norm in/out, q/k/v, attention out | norm in/out (the MLP's input), activation in/out
        attn_saved, mlp_saved = 4 * h + 2 * kvd, 2 * h + 2 * f
    else:
        # as GPT plus rotated q/k | SwiGLU gate/up/act/prod; each RMSNorm's float32 copy
        attn_saved, mlp_saved = 5 * h + 3 * kvd, 2 * h + 4 * f
    # outputs of the weighted ops (`weight_grad_input_bytes_per_sample`): column-parallel q, k,
    # v | MLP up (and gate); row-parallel out | down, and the norms, whole under TP
    row_and_norms = h * (1 + half_norms)
    norms = half_norms * _norm_params(c)
    qkv = h * (q + 2 * kvd) + (q + 2 * kvd if c.qkv_bias else 0)
    attn_params = qkv + q * h + (h if c.dense_bias else 0) + norms
    mlp_params = (gates + 1) * h * f + ((gates * f + h) if c.has_mlp_bias else 0) + norms
    upcast = _rms_upcast_bytes(c, s)
    rms_norms = 0 if c.family == "gpt" else half_norms

    def half(params, whole, flops, saved, weighted) -> dict:
        return dict(
            kind="half",
            params=params,
            stored_params=params,
            params_whole_under_tp=whole,
            fwd_flops_per_token=flops,
            send_bytes_per_sample=s * h * d,
            saved_bytes_per_sample=s * saved * d + upcast,
            saved_bytes_recompute_per_sample=s * h * d,
            saved_bytes_whole_under_tp_per_sample=s * 2 * h * d + upcast,
            weight_grad_input_bytes_per_sample=s * (weighted + row_and_norms) * d,
            weight_grad_input_whole_under_tp_per_sample=s * row_and_norms * d,
            weight_grad_input_rms_norm_bytes_per_sample=rms_norms * s * h * d,
        )

    # QK^T and AV over the full (unmasked) sequence, per token: 4 s q
    attn_flops = 2.0 * (h * (q + 2 * kvd) + q * h) + 4 * s * q
    attn = half(attn_params, norms + h * c.dense_bias, attn_flops, attn_saved, q + 2 * kvd)
    mlp_flops = 2.0 * (gates + 1) * h * f
    mlp = half(mlp_params, norms + h * c.has_mlp_bias, mlp_flops, mlp_saved, gates * f)
    return {**attn, "kind": "attention"}, {**mlp, "kind": "mlp"}


def _whole_block(attn: dict, mlp: dict) -> dict:
    """A transformer block: its two halves' sums, but one input kept under recomputation and
    one activation sent."""
    out = {k: attn[k] + mlp[k] for k in attn if k != "kind"}
    for key in ("send_bytes_per_sample", "saved_bytes_recompute_per_sample"):
        out[key] = attn[key]
    return {**out, "kind": "block"}


def _embedding(c: ModelConfig, s: int, d: int) -> dict:
    n = c.padded_vocab * c.hidden_size + (
        c.max_seq_len * c.hidden_size if c.position == "learned" else 0
    )
    return dict(
        kind="embedding",
        params=n,
        padding_params=c.vocab_padding_rows * c.hidden_size,
        stored_params=n,
        fwd_flops_per_token=0.0,
        send_bytes_per_sample=s * c.hidden_size * d,
        saved_bytes_per_sample=s * 8,  # token ids (int64)
        saved_bytes_recompute_per_sample=s * 8,
    )


def _head(c: ModelConfig, s: int, d: int) -> dict:
    h, v, pv = c.hidden_size, c.vocab_size, c.padded_vocab
    own = _norm_params(c) + (0 if c.tie_embeddings else pv * h)
    # Norm input and output, the logits (torch's pipeline stage keeps the last stage's output
    # until its backward: a view of the padded matmul output, so all `padded_vocab` columns stay)
    # and the loss's float32 log-probabilities over the `vocab_size` real columns.
    saved = s * (2 * h + pv) * d + s * v * 4 + _rms_upcast_bytes(c, s)
    return dict(
        kind="head",
        params=own,
        padding_params=0 if c.tie_embeddings else c.vocab_padding_rows * h,
        stored_params=_norm_params(c) + pv * h,
        fwd_flops_per_token=2.0 * h * pv,
        send_bytes_per_sample=4,  # the scalar loss
        saved_bytes_per_sample=saved,
        saved_bytes_recompute_per_sample=saved,
        weight_grad_input_bytes_per_sample=s * (pv + h) * d,  # the padded logits, the norm's out
        weight_grad_input_rms_norm_bytes_per_sample=0 if c.family == "gpt" else s * h * d,
        input_grad_frees_bytes_per_sample=s * pv * d + s * v * 4,
    )
