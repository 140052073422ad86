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

from hetpp.dataset.shards import Dataset, data_kind, open_dataset, open_shard
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


class TokenWindows:
    """Windows of a token stream held in one or more arrays (memory-mapped shards).

    In order (`shuffle_seed` None): sample g starts at token (g * seq_len) modulo the usable
    length, so the stream is read front to back and wraps around. Shuffled: the stream is cut into
    non-overlapping windows and epoch e visits them in a permutation drawn from (seed, e), so a
    batch mixes documents and the order still depends only on the seed."""

    def __init__(
        self, parts: list[np.ndarray], seq_len: int, where: str, shuffle_seed: int | None = None
    ):
        self.parts, self.seq_len, self.shuffle_seed = parts, seq_len, shuffle_seed
        self._perm: tuple[int, np.ndarray] | None = None
        self.ends = np.cumsum([len(p) for p in parts])
        total = int(self.ends[-1]) if parts else 0
        if total < seq_len + 1:
            raise SpecError(
                f"{total} tokens; need at least seq_len + 1 = {seq_len + 1}",
                file=where,
                field="--data",
            )
        self.span = total - seq_len
        self.windows = max(1, (total - 1) // seq_len)

    def _start(self, index: int) -> int:
        if self.shuffle_seed is None:
            return (index * self.seq_len) % self.span
        epoch, k = divmod(index, self.windows)
        if self._perm is None or self._perm[0] != epoch:
            rng = np.random.default_rng([self.shuffle_seed, epoch])
            self._perm = (epoch, rng.permutation(self.windows))
        return int(self._perm[1][k]) * self.seq_len

    def sample(self, index: int) -> torch.Tensor:
        start = self._start(index)
        stop = start + self.seq_len + 1
        first = int(np.searchsorted(self.ends, start, side="right"))
        pieces, pos = [], start
        for k in range(first, len(self.parts)):  # a window may straddle shards
            begin = int(self.ends[k]) - len(self.parts[k])
            pieces.append(self.parts[k][pos - begin : min(stop, int(self.ends[k])) - begin])
            pos = int(self.ends[k])
            if pos >= stop:
                break
        return torch.from_numpy(np.concatenate(pieces).astype(np.int64))


def file_tokens(path: str | Path, seq_len: int, vocab_size: int) -> TokenWindows:
    """Windows of one token file: text as bytes (tokens 0..255), a hetpp shard, or a headerless
    `.bin` of uint16 ids (checked against the vocabulary once)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("file not found", file=str(p), field="--data")
    kind = data_kind(p)
    if kind == "shard":
        tokens = open_shard(p)
    else:
        tokens = np.memmap(p, dtype=np.uint16 if kind == "uint16" else np.uint8, mode="r")
    # A byte file always fits a byte-level vocabulary; other files are scanned once.
    top = int(tokens.max()) if len(tokens) and np.iinfo(tokens.dtype).max >= vocab_size else 0
    if top >= vocab_size:
        raise SpecError(
            f"token id {top} is outside the model's vocabulary ({vocab_size})",
            file=str(p),
            field="--data",
        )
    return TokenWindows([tokens], seq_len, str(p))


def _dataset(path: str | Path, vocab_size: int) -> Dataset:
    ds = open_dataset(path)
    if ds.vocab_size > vocab_size:
        raise SpecError(
            f"the tokenizer's vocabulary ({ds.vocab_size}) is larger than the model's "
            f"({vocab_size})",
            file=str(ds.root / "index.json"),
            field="vocab_size",
        )
    return ds


VALIDATION_OFFSET = 1 << 40
"""Synthetic validation samples start here: training never reaches them."""


def make_source(data: str | None, plan: Plan, seed: int) -> TokenSource:
    """The training stream: synthetic, a prepared dataset's train split (windows shuffled per
    epoch by `seed`), or one token file (in order)."""
    if data is None:
        return SyntheticTokens(plan.model.vocab_size, plan.seq_len, seed)
    if data_kind(data) == "dataset":
        ds = _dataset(data, plan.model.vocab_size)
        return TokenWindows(ds.train, plan.seq_len, data, shuffle_seed=seed)
    return file_tokens(data, plan.seq_len, plan.model.vocab_size)


def validation_batch(data: str | None, plan: Plan, seed: int, count: int) -> torch.Tensor | None:
    """Fixed validation samples ([n <= count, seq_len + 1]): a prepared dataset's held-out split
    (its first windows), or synthetic samples training never draws; None for a single file."""
    if data is None:
        src: TokenSource = SyntheticTokens(plan.model.vocab_size, plan.seq_len, seed)
        return torch.stack([src.sample(VALIDATION_OFFSET + i) for i in range(count)])
    if data_kind(data) != "dataset":
        return None
    val = _dataset(data, plan.model.vocab_size).val
    if sum(len(v) for v in val) < plan.seq_len + 1:
        return None
    windows = TokenWindows(val, plan.seq_len, data)
    n = max(1, min(count, windows.span // plan.seq_len))  # distinct windows only
    return torch.stack([windows.sample(i) for i in range(n)])


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


def validation_rows(
    data: str | None, plan: Plan, seed: int, eval_every: int, eval_batches: int
) -> torch.Tensor | None:
    """The held-out rows `--eval-every` evaluates on (`eval_batches` global batches), None when
    validation is off; SpecError when the data has no held-out split."""
    if eval_every == 0:
        return None
    rows = validation_batch(data, plan, seed, eval_batches * plan.global_batch)
    if rows is None:
        raise SpecError(
            "--eval-every needs held-out data: a prepared dataset with a validation split "
            "(hetpp data prepare) or synthetic data",
            field="--eval-every",
        )
    return rows
