"""Tokenize text, JSONL or parquet with a local Hugging Face tokenizer into token shards.

Each input document (a text file, a JSONL line's field, a parquet row's column) is encoded and
followed by EOS. Documents are assigned to the validation split deterministically (every
`val_every`-th document, counting from the first), so the same inputs always give the same split.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hetpp.dataset.shards import INDEX, VERSION, token_dtype, write_shard
from hetpp.specs.errors import SpecError

TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".py")
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
BATCH_DOCS = 256


@dataclass(frozen=True, kw_only=True)
class PrepareOptions:
    tokenizer: str
    """A tokenizer.json file, or a folder holding one (the from_pretrained convention)."""
    inputs: tuple[str, ...]
    out: str
    field: str = "text"
    """JSONL key / parquet column holding the document text."""
    eos: str | None = None
    """EOS token; default: the tokenizer config's eos_token, else a usual name in the vocabulary."""
    val_every: int = 20
    """Every this-many-th document goes to the validation split (0: no validation split)."""
    shard_tokens: int = 1 << 26
    """Start a new shard after this many tokens."""


def load_tokenizer(path: str):
    """(tokenizers.Tokenizer, folder or None) from a tokenizer.json or a model folder."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SpecError("needs the `tokenizers` package: pip install 'hetpp[data]'") from None
    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise SpecError("no tokenizer.json here", file=str(p), field="--tokenizer")
    try:
        return Tokenizer.from_file(str(file)), file.parent
    except Exception as e:  # tokenizers raises its own Exception types
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecError(f"cannot read the tokenizer ({first})", file=str(file)) from None


def eos_id(tok, folder: Path, eos: str | None) -> int:
    if eos is None:
        cfg = folder / "tokenizer_config.json"
        if cfg.is_file():
            value = json.loads(cfg.read_text()).get("eos_token")
            eos = value.get("content") if isinstance(value, dict) else value
    names = (eos,) if eos else EOS_CANDIDATES
    for name in names:
        token = tok.token_to_id(name)
        if token is not None:
            return token
    raise SpecError(f"no EOS token {' or '.join(names)} in the vocabulary; name one", field="--eos")


def documents(path: Path, field: str) -> Iterator[str]:
    """The documents of one input file, by its suffix; other suffixes are an error."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise SpecError("file not found", file=str(path), field="--input")
    if suffix in TEXT_SUFFIXES:
        yield path.read_text(encoding="utf-8", errors="replace")
    elif suffix == ".jsonl":
        yield from _jsonl(path, field)
    elif suffix == ".parquet":
        yield from _parquet(path, field)
    else:
        raise SpecError(
            f"unsupported input format {suffix!r}; expected text ({', '.join(TEXT_SUFFIXES)}), "
            ".jsonl or .parquet",
            file=str(path),
            field="--input",
        )


def _jsonl(path: Path, field: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)[field]
            except (ValueError, KeyError, TypeError):
                raise SpecError(
                    f"line {n}: expected a JSON object with a string {field!r}",
                    file=str(path),
                    field="--field",
                ) from None
            if not isinstance(value, str):
                raise SpecError(f"line {n}: {field!r} is not a string", file=str(path))
            yield value


def _parquet(path: Path, field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SpecError("parquet input needs pyarrow: pip install 'hetpp[data]'") from None
    table = pq.ParquetFile(path)
    if field not in table.schema_arrow.names:
        raise SpecError(
            f"no column {field!r} (columns: {', '.join(table.schema_arrow.names)})",
            file=str(path),
            field="--field",
        )
    for batch in table.iter_batches(columns=[field]):
        yield from (v for v in batch.column(0).to_pylist() if v is not None)


@dataclass
class _Split:
    """Shards of one split being written."""

    root: Path
    name: str
    dtype: np.dtype
    limit: int
    pending: list[np.ndarray] = field(default_factory=list)
    entries: list[dict] = field(default_factory=list)
    tokens: int = 0
    docs: int = 0

    def add(self, ids: list[int]) -> None:
        self.pending.append(np.asarray(ids, dtype=self.dtype))
        self.tokens += len(ids)
        self.docs += 1
        if self.tokens >= self.limit:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        name = f"{self.name}_{len(self.entries):05d}.bin"
        write_shard(self.root / name, np.concatenate(self.pending))
        self.entries.append(dict(file=name, tokens=self.tokens, documents=self.docs))
        self.pending, self.tokens, self.docs = [], 0, 0


def prepare(opts: PrepareOptions, on_input: Callable[[Path], None] | None = None) -> dict:
    """Write the dataset; returns its index. `on_input` is called after each input file has been
    read (a progress bar)."""
    tok, folder = load_tokenizer(opts.tokenizer)
    eos = eos_id(tok, folder, opts.eos)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    root = Path(opts.out)
    root.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(vocab)
    splits = {s: _Split(root, s, dtype, opts.shard_tokens) for s in ("train", "val")}
    count = 0
    for docs in _batches(opts, on_input or (lambda _: None)):
        for enc in tok.encode_batch(docs):
            val = opts.val_every > 0 and count % opts.val_every == opts.val_every - 1
            splits["val" if val else "train"].add([*enc.ids, eos])
            count += 1
    for s in splits.values():
        s.flush()
    if not splits["train"].entries:
        raise SpecError("no training documents in the inputs", field="--input")
    index = dict(
        format=VERSION,
        dtype=dtype.name,
        vocab_size=vocab,
        eos_id=eos,
        tokenizer=str(Path(opts.tokenizer).resolve()),
        inputs=list(opts.inputs),
        documents=count,
        train=splits["train"].entries,
        val=splits["val"].entries,
    )
    (root / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return index


def _batches(opts: PrepareOptions, on_input: Callable[[Path], None]) -> Iterator[list[str]]:
    paths = [Path(p) for p in opts.inputs]
    for p in paths:  # every input's format checked before any work
        if p.suffix.lower() not in (*TEXT_SUFFIXES, ".jsonl", ".parquet") or not p.is_file():
            next(documents(p, opts.field))
    buf: list[str] = []
    for p in paths:
        for doc in documents(p, opts.field):
            buf.append(doc)
            if len(buf) == BATCH_DOCS:
                yield buf
                buf = []
        on_input(p)
    if buf:
        yield buf
