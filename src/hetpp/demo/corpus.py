"""Real text that is on every machine: the Python standard library's own source files, a BPE
tokenizer trained on them in seconds, and the token dataset `hetpp data prepare` makes of them.

The demo model has a 256-entry vocabulary, so the tokenizer is a character-level BPE (Metaspace
pre-tokenizer, the 150 most frequent characters, merges up to 256 entries): real subword units on
real text. The files are taken in sorted path order, so a machine always builds the same corpus
(different Python versions ship different files).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from hetpp.dataset.prepare import PrepareOptions, prepare
from hetpp.specs.errors import SpecError

EOS = "<|endoftext|>"


def stdlib_sources(limit_bytes: int) -> list[Path]:
    """The standard library's .py files (tests left out), sorted, up to `limit_bytes` in total."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for p in sorted(root.rglob("*.py")):
        parts = set(p.relative_to(root).parts[:-1])
        if parts & {"test", "tests", "idle_test", "site-packages", "dist-packages"}:
            continue
        out.append(p)
        total += p.stat().st_size
        if total >= limit_bytes:
            break
    if not out:
        raise SpecError("no Python standard library sources found", file=str(root))
    return out


def train_tokenizer(files: list[Path], path: Path, vocab_size: int) -> Path:
    """A character-level BPE of `vocab_size` entries (EOS included) trained on `files`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, limit_alphabet=150, special_tokens=["<unk>", EOS]
    )
    tok.train([str(f) for f in files], trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def build_corpus(out: Path, limit_bytes: int = 2_000_000, vocab_size: int = 256) -> Path:
    """Tokenizer and prepared dataset under `out`; returns the dataset folder."""
    files = stdlib_sources(limit_bytes)
    tokenizer = train_tokenizer(files, out / "tokenizer.json", vocab_size)
    data = out / "data"
    prepare(PrepareOptions(tokenizer=str(tokenizer), inputs=tuple(map(str, files)), out=str(data)))
    return data
