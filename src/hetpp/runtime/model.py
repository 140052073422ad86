"""Decoder layers (GPT and Llama families) cut exactly like the spec's layer list.

Layer 0 is the embedding, then the N blocks (or, at `layer_unit` half, each block's attention
half and MLP half, `BlockHalf`), and last the head (final norm + LM head; the loss is taken on its
logits). A stage is any `[start, end)` range of these. Every layer draws its initial weights
from its own generator, seeded by (seed, its index in the block-unit list), so a layer starts
identical whatever rank, plan or layer unit builds it.

The embedding and LM head matrices have `padded_vocab` rows (`ModelConfig.vocab_multiple`): the
padding rows start at zero, are never looked up, and the head returns only the `vocab_size` real
logits, so no gradient reaches them and they stay zero under AdamW; the loss is that of the
unpadded model. `vocab_rows` names the padded matrices for Hugging Face import and export.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from hetpp.specs.model import ModelConfig

TIED_HEAD_PARAM = "lm_head.weight"
"""Name, inside the head, of the weight that is the embedding's `tok.weight` when tied."""
TIED_EMBEDDING_PARAM = "tok.weight"
VOCAB_PARAMS = (TIED_EMBEDDING_PARAM, TIED_HEAD_PARAM)
"""Parameters (names inside the embedding and the head) with one row per vocabulary entry."""


def layer_generator(seed: int, index: int) -> torch.Generator:
    """The generator a layer's initial weights come from; depends only on (seed, index)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, unit_offset: bool = False):
        super().__init__()
        self.eps, self.unit_offset = eps, unit_offset
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Half-precision inputs are normalised in fp32 (as Llama does); fp32/fp64 stay as they are.
        xf = x.float() if x.element_size() < 4 else x
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:  # Gemma scales in fp32 by 1 + weight, then casts
            return (y * (1.0 + self.weight.to(y.dtype))).to(x.dtype)
        return self.weight * y.to(x.dtype)


def _norm(c: ModelConfig) -> nn.Module:
    if c.family == "gpt":
        return nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
    return RMSNorm(c.hidden_size, c.norm_eps, c.norm_unit_offset)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def inverse_frequencies(c: ModelConfig) -> torch.Tensor:
    """Rotary inverse frequencies in float64, with `rope_scaling` applied as transformers does."""
    dim = c.rotary_dim
    inv = c.rope_theta ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    rs = c.rope_scaling
    if rs is None:
        return inv
    if rs.type == "linear":
        return inv / rs.factor
    # Llama-3.1: long wavelengths scaled by 1/factor, short ones kept, a smooth blend between.
    wavelen = 2 * math.pi / inv
    low_wl = rs.original_max_seq_len / rs.low_freq_factor
    high_wl = rs.original_max_seq_len / rs.high_freq_factor
    scaled = torch.where(wavelen > low_wl, inv / rs.factor, inv)
    smooth = (rs.original_max_seq_len / wavelen - rs.low_freq_factor) / (
        rs.high_freq_factor - rs.low_freq_factor
    )
    blended = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = (wavelen >= high_wl) & (wavelen <= low_wl)
    return torch.where(medium, blended, scaled)


@functools.lru_cache(maxsize=16)
def rotary_table(
    c: ModelConfig, seq: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of the rotary angles of positions 0..seq-1, shape (seq, rotary_dim), in `dtype`.

    Angles, cosines and sines in float64 on the CPU, then one cast: in bf16 an angle of position
    1000 would be rounded to a multiple of 4 radians before its cosine was taken (transformers
    takes them in fp32 for the same reason). Built once per (model, length, device, dtype) and
    shared by every layer: rebuilt in each forward, the CPU work and the copy to the device
    stalled the GPU (a Llama-2-7B block's forward at 1.9-2.4x its predicted time on an H200).
    No buffer: nothing to checkpoint; outside inference mode, so training may save it."""
    with torch.inference_mode(False), torch.no_grad():
        ang = torch.outer(torch.arange(seq, dtype=torch.float64), inverse_frequencies(c))
        ang = torch.cat((ang, ang), dim=-1)
        return ang.cos().to(device=device, dtype=dtype), ang.sin().to(device=device, dtype=dtype)


def _softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads, optional (partial, scaled) rotary positions,
    an optional sliding window and optional soft-capping of the scores."""

    def __init__(self, c: ModelConfig, sliding: bool = False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.kv_heads, c.head_dim
        kv_dim = c.kv_heads * c.head_dim
        self.qkv = nn.Linear(c.hidden_size, c.q_dim + 2 * kv_dim, bias=c.qkv_bias)
        self.out = nn.Linear(c.q_dim, c.hidden_size, bias=c.dense_bias)
        self.rope = c.position == "rope"
        self.rotary_dim = c.rotary_dim
        self.config = c
        self.scale = c.attn_scale or c.head_dim**-0.5
        self.window = c.sliding_window if sliding else None
        self.softcap = c.attn_logit_softcap

    def _apply_rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = self.rotary_dim
        rot = x[..., :r] * cos + _rotate_half(x[..., :r]) * sin
        return rot if r == self.head_dim else torch.cat((rot, x[..., r:]), dim=-1)

    def _mask(self, s: int, device: torch.device) -> torch.Tensor | None:
        """Boolean mask (True: attend) when causal alone does not say it; None otherwise."""
        if self.window is None and self.softcap is None:
            return None
        i = torch.arange(s, device=device)
        mask = i[None, :] <= i[:, None]
        if self.window is not None:
            mask &= i[None, :] > i[:, None] - self.window
        return mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        kv = self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split((self.heads * self.head_dim, kv, kv), dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rope:
            cos, sin = rotary_table(self.config, s, q.device, q.dtype)
            q, k = self._apply_rotary(q, cos, sin), self._apply_rotary(k, cos, sin)
        if self.kv_heads != self.heads:
            # repeat_interleave rather than SDPA's enable_gqa: same result on every torch version.
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        mask = self._mask(s, x.device)
        if self.softcap is None:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale
            )
        else:  # SDPA cannot soft-cap the scores: the explicit form
            scores = _softcap(q @ k.transpose(-2, -1) * self.scale, self.softcap)
            y = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


_ACTIVATIONS = {
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "silu": F.silu,
    "relu": F.relu,
}


class MLP(nn.Module):
    """GPT: dense -> activation -> dense; Llama: gated (SwiGLU, or GeGLU for Gemma)."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gated, self.act = c.gated, _ACTIVATIONS[c.act]
        h, f, bias = c.hidden_size, c.ffn_hidden_size, c.has_mlp_bias
        if self.gated:
            self.gate = nn.Linear(h, f, bias=bias)
        self.up = nn.Linear(h, f, bias=bias)
        self.down = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    """Pre-norm transformer block; `block` (0-based) picks sliding or full attention."""

    def __init__(self, c: ModelConfig, block: int = 0):
        super().__init__()
        self.parallel = c.parallel_residual
        self.norm1, self.attn = _norm(c), Attention(c, sliding=c.is_sliding(block))
        self.norm2, self.mlp = _norm(c), MLP(c)
        if c.sandwich_norm:
            self.post_attn_norm, self.post_mlp_norm = _norm(c), _norm(c)
        self.sandwich = c.sandwich_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel:
            return x + self.attn(self.norm1(x)) + self.mlp(self.norm2(x))
        return _mlp_half(self, _attention_half(self, x))


def _attention_half(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x plus the attention of `m` (a Block or its attention half) on its normed input."""
    a = m.attn(m.norm1(x))
    return x + (m.post_attn_norm(a) if m.sandwich else a)


def _mlp_half(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x plus the MLP of `m` (a Block or its MLP half) on its normed input."""
    y = m.mlp(m.norm2(x))
    return x + (m.post_mlp_norm(y) if m.sandwich else y)


_HALF_MODULES = {
    "attention": ("norm1", "attn", "post_attn_norm"),
    "mlp": ("norm2", "mlp", "post_mlp_norm"),
}


class BlockHalf(nn.Module):
    """A Block's attention or MLP half (`layer_unit` half): the Block's own submodules under the
    Block's names, so parameter names inside the layer are those inside a Block."""

    def __init__(self, block: Block, kind: str):
        super().__init__()
        self.kind, self.sandwich = kind, block.sandwich
        for name in _HALF_MODULES[kind]:
            if hasattr(block, name):
                setattr(self, name, getattr(block, name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (_attention_half if self.kind == "attention" else _mlp_half)(self, x)


class Embedding(nn.Module):
    """Token embedding, plus learned absolute positions when the model has them."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(c.padded_vocab, c.hidden_size)
        self.pos = nn.Embedding(c.max_seq_len, c.hidden_size) if c.position == "learned" else None
        self.scale = c.hidden_size**0.5 if c.scale_embeddings else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.scale is not None:  # Gemma: the factor rounded to the activation dtype first
            x = x * torch.tensor(self.scale, dtype=x.dtype)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return x


class Head(nn.Module):
    """Final norm and LM head; returns logits (the schedule's loss function reads them)."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.norm = _norm(c)
        self.lm_head = nn.Linear(c.hidden_size, c.padded_vocab, bias=False)
        self.vocab_size = c.vocab_size
        self.softcap = c.final_logit_softcap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The GEMM runs over the padded vocabulary (tensor-core tiles); the padding columns are
        # cut before the loss, which then sees exactly the unpadded model's logits.
        logits = self.lm_head(self.norm(x))[..., : self.vocab_size]
        return _softcap(logits, self.softcap)


@torch.no_grad()
def _init_layer(layer: nn.Module, c: ModelConfig, index: int, seed: int) -> None:
    g = layer_generator(seed, index)
    # GPT-2's scaled init for projections that write into the residual stream.
    resid_std = c.init_std / math.sqrt(2 * c.num_layers)
    for name, p in layer.named_parameters():
        if name.endswith("bias"):
            p.zero_()
        elif "norm" in name:
            p.fill_(0.0 if c.norm_unit_offset else 1.0)
        else:
            std = resid_std if name in ("attn.out.weight", "mlp.down.weight") else c.init_std
            rows = vocab_rows(c, name, p)
            p.zero_()
            p[:rows].copy_(torch.randn((rows, *p.shape[1:]), generator=g) * std)
    if isinstance(layer, Head) and c.tie_embeddings:
        # The tied copy starts as the embedding's token matrix: the first draw of layer 0.
        g0 = layer_generator(seed, 0)
        w = layer.lm_head.weight
        w.zero_()
        w[: c.vocab_size].copy_(torch.randn((c.vocab_size, w.shape[1]), generator=g0) * c.init_std)


def vocab_rows(c: ModelConfig, name: str, p: torch.Tensor) -> int:
    """Rows of parameter `name` (inside its layer) that are real: `vocab_size` for the padded
    embedding and head matrices, all of them for every other parameter."""
    return c.vocab_size if name in VOCAB_PARAMS else p.shape[0]


def build_layer(c: ModelConfig, index: int, seed: int, dtype: torch.dtype) -> nn.Module:
    """Layer `index` of the model's layer list, initialised from (seed, index)."""
    if not 0 <= index <= c.head_index:
        raise IndexError(f"layer {index} outside 0..{c.head_index}")
    # Initialise in fp32 on CPU so every dtype and device starts from the same draws.
    kind = c.layer_kind(index)
    if kind == "embedding":
        layer: nn.Module = Embedding(c)
    elif kind == "head":
        layer = Head(c)
    else:
        layer = Block(c, c.block_of(index))
    # Drawn as the block-unit list's layer; a half then keeps its part of the whole block, so
    # the weights are the same whichever unit cuts the list.
    _init_layer(layer, c, c.in_blocks(index), seed)
    if kind in ("attention", "mlp"):
        layer = BlockHalf(layer, kind)
    return layer.to(dtype)


class StageModule(nn.Module):
    """Layers `[start, end)` run in order; the tied head shares the embedding's Parameter when both
    are here, and holds its own copy otherwise (gradsync keeps the copies equal)."""

    def __init__(self, c: ModelConfig, start: int, end: int, seed: int, dtype: torch.dtype):
        super().__init__()
        self.config, self.start, self.end = c, start, end
        self.layers = nn.ModuleDict(
            {str(i): build_layer(c, i, seed, dtype) for i in range(start, end)}
        )
        head = c.head_index
        if c.tie_embeddings and start == 0 and end == head + 1:
            self.layers[str(head)].lm_head.weight = self.layers["0"].tok.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x

    def layer(self, index: int) -> nn.Module:
        return self.layers[str(index)]

    def tied_weight(self) -> nn.Parameter | None:
        """This stage's tied embedding/head weight (one Parameter, shared or a copy), if any."""
        if not self.config.tie_embeddings:
            return None
        if self.start == 0:
            return self.layer(0).tok.weight
        if self.end == self.config.layer_list_len:
            return self.layer(self.config.head_index).lm_head.weight
        return None

    def own_parameters(self, index: int) -> Iterator[tuple[str, nn.Parameter]]:
        """Layer `index`'s parameters as the spec counts them: a tied head's weight belongs to the
        embedding (layer 0), so the head leaves it out."""
        tied_head = self.config.tie_embeddings and index == self.config.head_index
        for name, p in self.layer(index).named_parameters(remove_duplicate=False):
            if not (tied_head and name == TIED_HEAD_PARAM):
                yield name, p


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies (half-precision logits are upcast to fp32 first)."""
    x = logits.float() if logits.element_size() < 4 else logits
    return F.cross_entropy(x.flatten(0, 1), targets.flatten(), reduction="sum")


class RankModel(nn.Module):
    """The stages one rank runs: one `StageModule` per layer range, in pipeline order (several
    under an interleaved or V-shaped schedule). Asked by layer index as a stage is, whichever
    stage holds the layer. A tied head on the embedding's rank shares its Parameter (as inside
    one stage), so the rank holds the tied weight once."""

    def __init__(self, stages: list[StageModule]):
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.config = stages[0].config
        self._holder = {i: k for k, st in enumerate(stages) for i in range(st.start, st.end)}
        tied = [t for t in (st.tied_weight() for st in stages) if t is not None]
        head = self.config.head_index
        if len(tied) == 2 and tied[0] is not tied[1]:  # embedding and head in different stages
            self.layer(head).lm_head.weight = tied[0]

    def holder(self, index: int) -> int:
        """Position in `stages` of the stage holding layer `index`."""
        return self._holder[index]

    @property
    def layer_indices(self) -> list[int]:
        """Every layer this rank holds, in pipeline order."""
        return list(self._holder)

    def layer(self, index: int) -> nn.Module:
        return self.stages[self.holder(index)].layer(index)

    def own_parameters(self, index: int) -> Iterator[tuple[str, nn.Parameter]]:
        """Layer `index`'s parameters as the spec counts them (`StageModule.own_parameters`)."""
        return self.stages[self.holder(index)].own_parameters(index)

    def tied_weight(self) -> nn.Parameter | None:
        """The rank's tied embedding/head weight, if it holds either end."""
        return next((t for t in (st.tied_weight() for st in self.stages) if t is not None), None)
