"""Decoder layers (GPT and Llama families) cut exactly like the spec's layer list.

Layer 0 is the embedding, 1..N the blocks, N+1 the head (final norm + LM head; the loss is taken
on its logits). A stage is any `[start, end)` range of these. Every layer draws its initial weights
from its own generator, seeded by (seed, layer index), so a layer starts identical whatever rank or
plan builds it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from hetpp.specs.model import ModelConfig

INIT_STD = 0.02
TIED_HEAD_PARAM = "lm_head.weight"
"""Name, inside the head, of the weight that is the embedding's `tok.weight` when tied."""
TIED_EMBEDDING_PARAM = "tok.weight"


def layer_generator(seed: int, index: int) -> torch.Generator:
    """The generator a layer's initial weights come from; depends only on (seed, index)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Half-precision inputs are normalised in fp32 (as Llama does); fp32/fp64 stay as they are.
        xf = x.float() if x.element_size() < 4 else x
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def _norm(c: ModelConfig) -> nn.Module:
    if c.family == "gpt":
        return nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
    return RMSNorm(c.hidden_size, c.norm_eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads and optional rotary positions."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.kv_heads, c.head_dim
        kv_dim = c.kv_heads * c.head_dim
        self.qkv = nn.Linear(c.hidden_size, c.hidden_size + 2 * kv_dim, bias=c.qkv_bias)
        self.out = nn.Linear(c.hidden_size, c.hidden_size, bias=c.dense_bias)
        self.rope = c.position == "rope"
        self.rope_theta = c.rope_theta

    def _rotary(self, seq: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Angles in float64 on the fly: cheap next to attention, and no buffer to checkpoint.
        inv = self.rope_theta ** -(
            torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim
        )
        ang = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1).to(device=like.device, dtype=like.dtype)
        return ang.cos(), ang.sin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        kv = self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split((h, kv, kv), dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rope:
            cos, sin = self._rotary(s, q)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        if self.kv_heads != self.heads:
            # repeat_interleave rather than SDPA's enable_gqa: same result on every torch version.
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    """GPT: dense -> GELU(tanh) -> dense; Llama: SwiGLU without biases."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gated = c.family == "llama"
        h, f = c.hidden_size, c.ffn_hidden_size
        if self.gated:
            self.gate = nn.Linear(h, f, bias=False)
            self.up = nn.Linear(h, f, bias=False)
            self.down = nn.Linear(f, h, bias=False)
        else:
            self.up = nn.Linear(h, f, bias=c.dense_bias)
            self.down = nn.Linear(f, h, bias=c.dense_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.norm1, self.attn = _norm(c), Attention(c)
        self.norm2, self.mlp = _norm(c), MLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Embedding(nn.Module):
    """Token embedding, plus learned absolute positions when the model has them."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(c.vocab_size, c.hidden_size)
        self.pos = nn.Embedding(c.max_seq_len, c.hidden_size) if c.position == "learned" else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return x


class Head(nn.Module):
    """Final norm and LM head; returns logits (the schedule's loss function reads them)."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.norm = _norm(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


@torch.no_grad()
def _init_layer(layer: nn.Module, c: ModelConfig, index: int, seed: int) -> None:
    g = layer_generator(seed, index)
    # GPT-2's scaled init for projections that write into the residual stream.
    resid_std = INIT_STD / math.sqrt(2 * c.num_layers)
    for name, p in layer.named_parameters():
        if name.endswith("bias"):
            p.zero_()
        elif "norm" in name:
            p.fill_(1.0)
        else:
            std = resid_std if name in ("attn.out.weight", "mlp.down.weight") else INIT_STD
            p.copy_(torch.randn(p.shape, generator=g) * std)
    if isinstance(layer, Head) and c.tie_embeddings:
        # The tied copy starts as the embedding's token matrix: the first draw of layer 0.
        g0 = layer_generator(seed, 0)
        layer.lm_head.weight.copy_(torch.randn(layer.lm_head.weight.shape, generator=g0) * INIT_STD)


def build_layer(c: ModelConfig, index: int, seed: int, dtype: torch.dtype) -> nn.Module:
    """Layer `index` of the model's layer list, initialised from (seed, index)."""
    if not 0 <= index <= c.num_layers + 1:
        raise IndexError(f"layer {index} outside 0..{c.num_layers + 1}")
    cls = Embedding if index == 0 else Head if index == c.num_layers + 1 else Block
    # Initialise in fp32 on CPU so every dtype and device starts from the same draws.
    layer = cls(c)
    _init_layer(layer, c, index, seed)
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
        head = c.num_layers + 1
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
        if self.end == self.config.num_layers + 2:
            return self.layer(self.config.num_layers + 1).lm_head.weight
        return None

    def own_parameters(self, index: int) -> Iterator[tuple[str, nn.Parameter]]:
        """Layer `index`'s parameters as the spec counts them: a tied head's weight belongs to the
        embedding (layer 0), so the head leaves it out."""
        tied_head = self.config.tie_embeddings and index == self.config.num_layers + 1
        for name, p in self.layer(index).named_parameters(remove_duplicate=False):
            if not (tied_head and name == TIED_HEAD_PARAM):
                yield name, p


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies (half-precision logits are upcast to fp32 first)."""
    x = logits.float() if logits.element_size() < 4 else logits
    return F.cross_entropy(x.flatten(0, 1), targets.flatten(), reduction="sum")
