"""Deterministic token batches: sample g of the stream is fixed, whatever the plan.

The data is an endless sequence of samples (seq_len + 1 tokens: inputs and shifted targets). Step t
of a run with global batch B takes samples [t*B, (t+1)*B); pipeline p takes the contiguous slice
that starts after the earlier pipelines' batches. A checkpoint stores the samples consumed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from hetpp.specs.errors import SpecError
from hetpp.specs.plan import Plan


class TokenSource(Protocol):
    seq_len: int

    def sample(self, index: int) -> torch.Tensor:
        """Sample `index` of the stream: int64 tensor of seq_len + 1 tokens."""
        ...


class SyntheticTokens:
    """Seeded sequences with structure a model can learn: a random phrase of 2..16 tokens, repeated
    (so loss falls as the model learns to copy), drawn from a per-sample generator."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def sample(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        period = int(torch.randint(2, 17, (), generator=g))
        phrase = torch.randint(0, self.vocab_size, (period,), generator=g)
        return phrase.repeat(self.seq_len // period + 2)[: self.seq_len + 1]


class FileTokens:
    """Consecutive windows of a token file: text as bytes (tokens 0..255), or `.bin` uint16 ids.

    Sample g starts at token (g * seq_len) modulo the usable length, so the file is read in order
    and wraps around."""

    def __init__(self, path: str | Path, seq_len: int, vocab_size: int):
        p = Path(path)
        if not p.is_file():
            raise SpecError("file not found", file=str(p), field="--data")
        dtype = np.uint16 if p.suffix == ".bin" else np.uint8
        self.tokens = np.memmap(p, dtype=dtype, mode="r")
        self.seq_len = seq_len
        if len(self.tokens) < seq_len + 1:
            raise SpecError(
                f"{len(self.tokens)} tokens; need at least seq_len + 1 = {seq_len + 1}",
                file=str(p),
                field="--data",
            )
        # A byte file always fits a byte-level vocabulary; other files are scanned once.
        top = int(self.tokens.max()) if np.iinfo(dtype).max >= vocab_size else 0
        if top >= vocab_size:
            raise SpecError(
                f"token id {top} is outside the model's vocabulary ({vocab_size})",
                file=str(p),
                field="--data",
            )
        self.span = len(self.tokens) - seq_len

    def sample(self, index: int) -> torch.Tensor:
        start = (index * self.seq_len) % self.span
        window = self.tokens[start : start + self.seq_len + 1].astype(np.int64)
        return torch.from_numpy(window)


def make_source(data: str | None, plan: Plan, seed: int) -> TokenSource:
    if data is None:
        return SyntheticTokens(plan.model.vocab_size, plan.seq_len, seed)
    return FileTokens(data, plan.seq_len, plan.model.vocab_size)


def pipeline_slices(plan: Plan) -> list[tuple[int, int]]:
    """[offset, offset + batch) of each pipeline inside the global batch."""
    out, offset = [], 0
    for pipe in plan.pipelines:
        out.append((offset, offset + pipe.batch))
        offset += pipe.batch
    return out


def batch(source: TokenSource, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of samples [first, first + count), each [count, seq_len]."""
    rows = torch.stack([source.sample(first + i) for i in range(count)])
    return rows[:, :-1], rows[:, 1:]
