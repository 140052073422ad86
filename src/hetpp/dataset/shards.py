"""The on-disk token format: shards with a small header, and an index that lists them.

    OUT/index.json        {"format": 1, "dtype": "uint16", "vocab_size": V, "eos_id": E,
                           "train": [{"file": "train_00000.bin", "tokens": n, "documents": d}],
                           "val": [...], "tokenizer": ..., "inputs": [...]}
    OUT/train_00000.bin   header (HEADER bytes) then `tokens` ids of `dtype`, little-endian

Header: 8-byte magic b"HETPPTOK", uint32 version, uint32 bytes per token (2 or 4), uint64 token
count. Documents are concatenated, each followed by the tokenizer's EOS id. numpy only (no torch),
so a dataset can be inspected without the runtime.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetpp.specs.errors import SpecError

MAGIC = b"HETPPTOK"
VERSION = 1
INDEX = "index.json"
_HEADER = struct.Struct("<8sIIQ")
HEADER = _HEADER.size
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return DTYPES[2] if vocab_size <= 1 << 16 else DTYPES[4]


def write_shard(path: Path, tokens: np.ndarray) -> None:
    with open(path, "wb") as f:
        f.write(_HEADER.pack(MAGIC, VERSION, tokens.dtype.itemsize, len(tokens)))
        f.write(tokens.astype(tokens.dtype.newbyteorder("<"), copy=False).tobytes())


def is_shard(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def open_shard(path: Path) -> np.ndarray:
    """The shard's tokens, memory-mapped (read-only); SpecError on a bad header or size."""
    with open(path, "rb") as f:
        head = f.read(HEADER)
    if len(head) < HEADER:
        raise SpecError("too short for a token shard header", file=str(path))
    magic, version, width, count = _HEADER.unpack(head)
    if magic != MAGIC or version != VERSION or width not in DTYPES:
        raise SpecError(
            f"not a version-{VERSION} hetpp token shard (magic {magic!r}, version {version}, "
            f"{width} bytes per token)",
            file=str(path),
        )
    if path.stat().st_size != HEADER + width * count:
        raise SpecError(f"truncated: the header says {count} tokens", file=str(path))
    return np.memmap(path, dtype=DTYPES[width], mode="r", offset=HEADER, shape=(count,))


@dataclass(frozen=True)
class Dataset:
    """A prepared dataset: its index and its train / validation token streams."""

    root: Path
    index: dict
    train: list[np.ndarray]
    val: list[np.ndarray]

    @property
    def vocab_size(self) -> int:
        return int(self.index["vocab_size"])


def is_dataset(path: str | Path) -> bool:
    p = Path(path)
    return (p / INDEX).is_file() if p.is_dir() else p.name == INDEX


def open_dataset(path: str | Path) -> Dataset:
    """Open a prepared dataset (its folder or its index.json); shards are memory-mapped."""
    p = Path(path)
    root = p if p.is_dir() else p.parent
    index_path = root / INDEX
    try:
        index = json.loads(index_path.read_text())
        splits = {s: [root / e["file"] for e in index[s]] for s in ("train", "val")}
        int(index["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecError(f"not a hetpp dataset index ({e})", file=str(index_path)) from None
    if index.get("format") != VERSION:
        raise SpecError(f"dataset format is not {VERSION}", file=str(index_path), field="format")
    return Dataset(root, index, *([open_shard(f) for f in splits[s]] for s in ("train", "val")))


BYTE_SUFFIXES = (".txt", ".text")


def data_kind(path: str | Path) -> str:
    """What `hetpp train --data PATH` reads: "dataset" (prepared folder or index.json), "shard"
    (one hetpp shard), "uint16" (a headerless .bin of uint16 ids) or "bytes" (a text file, bytes
    as tokens 0..255). Anything else is a SpecError, not garbage tokens."""
    p = Path(path)
    if is_dataset(p):
        return "dataset"
    if not p.is_file():
        raise SpecError("file not found (nor a dataset folder)", file=str(p), field="--data")
    if p.suffix == ".bin":
        if not is_shard(p) and p.with_suffix(".idx").is_file():
            raise SpecError(
                "a Megatron-style indexed dataset (.bin + .idx) is not read; prepare the text "
                "with `hetpp data prepare`",
                file=str(p),
                field="--data",
            )
        return "shard" if is_shard(p) else "uint16"
    if p.suffix.lower() in BYTE_SUFFIXES:
        return "bytes"
    raise SpecError(
        f"unsupported data format {p.suffix or p.name!r}; expected a dataset from `hetpp data "
        "prepare` (folder or index.json), a .bin of token ids or a .txt file (bytes)",
        file=str(p),
        field="--data",
    )
