"""Profile tables: per (GPU type, layer kind, micro-batch size) forward/backward seconds and bytes.

File format (CSV, one row per measurement; `hetpp profile` writes it, `--profile` reads it):

    gpu,model,seq_len,layer,mbs,fwd_s,bwd_s,act_bytes
    A100-80GB,gpt3-1.3b,2048,block,4,0.0123,0.0261,1073741824

`layer` is `embedding`, `block` or `head`; `bwd_s` is the backward alone; `act_bytes` is the memory
one forward keeps for backward. Rows of one file may hold several GPU types.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hetpp.specs.errors import SpecError
from hetpp.specs.io import read_text, write_atomic

COLUMNS = ("gpu", "model", "seq_len", "layer", "mbs", "fwd_s", "bwd_s", "act_bytes")
LAYER_KINDS = ("embedding", "block", "head")


class ProfileRow(NamedTuple):
    gpu: str
    """GPU type name as in the cluster file."""
    model: str
    """Model name the layers were measured for."""
    seq_len: int
    layer: str
    """Layer kind: embedding, block or head."""
    mbs: int
    """Micro-batch size (samples)."""
    fwd_s: float
    bwd_s: float
    act_bytes: int


class ProfileTable:
    """A set of measured rows with lookup and interpolation in micro-batch size."""

    def __init__(self, rows: Iterable[ProfileRow], files: Iterable[str] | None = None):
        self.rows = tuple(rows)
        # The file each row was read from ("" when built in memory), for error messages.
        self.files = tuple(files) if files is not None else ("",) * len(self.rows)

    def gpus(self) -> set[str]:
        return {r.gpu.lower() for r in self.rows}

    def _select(self, keep: Iterable[int]) -> ProfileTable:
        idx = list(keep)
        return ProfileTable((self.rows[i] for i in idx), (self.files[i] for i in idx))

    def for_gpu(self, gpu: str) -> ProfileTable:
        return self._select(i for i, r in enumerate(self.rows) if r.gpu.lower() == gpu.lower())

    def for_model(self, model: str, seq_len: int) -> ProfileTable:
        """The rows measured for `model` at `seq_len`. A GPU type that has rows, but none for
        this model and sequence length, is an error naming its files: another model's (or
        length's) layer times would otherwise price this one without a word."""
        keep = [
            i
            for i, r in enumerate(self.rows)
            if r.model.lower() == model.lower() and r.seq_len == seq_len
        ]
        for gpu in sorted(self.gpus() - {self.rows[i].gpu.lower() for i in keep}):
            idx = [i for i, r in enumerate(self.rows) if r.gpu.lower() == gpu]
            have = sorted({(self.rows[i].model, self.rows[i].seq_len) for i in idx})
            files = sorted({self.files[i] for i in idx if self.files[i]})
            raise SpecError(
                f"rows for GPU {self.rows[idx[0]].gpu!r} were measured for "
                + ", ".join(f"{m} at seq_len {s}" for m, s in have)
                + f", not {model} at seq_len {seq_len}; profile that "
                f"(`hetpp profile --model {model} --seq-len {seq_len}`) or leave the file out",
                file=", ".join(files) or None,
                field="model",
            )
        return self._select(keep)

    def scaled(self, gpu: str, factor: float) -> ProfileTable:
        """Rows re-labelled as `gpu` with times multiplied by `factor` (CPU emulation of a GPU)."""
        return ProfileTable(
            (
                r._replace(gpu=gpu, fwd_s=r.fwd_s * factor, bwd_s=r.bwd_s * factor)
                for r in self.rows
            ),
            self.files,
        )

    def lookup(self, gpu: str, layer: str, mbs: float) -> tuple[float, float, float]:
        """(fwd_s, bwd_s, act_bytes) of one `layer` kind at micro-batch size `mbs`.

        Piecewise-linear in mbs between measured sizes; beyond the largest, per-sample cost of the
        largest; below the smallest, the smallest's time (launch-bound) and proportional bytes."""
        pts = sorted(
            (r.mbs, r.fwd_s, r.bwd_s, r.act_bytes)
            for r in self.rows
            if r.gpu.lower() == gpu.lower() and r.layer == layer
        )
        if not pts:
            raise KeyError((gpu, layer))
        x = np.array([p[0] for p in pts], dtype=float)
        ys = np.array([p[1:] for p in pts], dtype=float)
        if mbs >= x[-1]:
            return tuple(float(v) for v in ys[-1] * (mbs / x[-1]))  # type: ignore[return-value]
        if mbs <= x[0]:
            f, b, a = ys[0]
            return float(f), float(b), float(a * mbs / x[0])
        return tuple(float(np.interp(mbs, x, ys[:, k])) for k in range(3))  # type: ignore[return-value]

    def save(self, path: str | Path) -> None:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(COLUMNS)
        w.writerows(self.rows)
        write_atomic(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> ProfileTable:
        file = str(path)
        reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
        try:
            missing = set(COLUMNS) - set(reader.fieldnames or ())
            if missing:
                raise SpecError(
                    f"missing columns {sorted(missing)}; expected {','.join(COLUMNS)}",
                    file=file,
                    field="header",
                )
            rows = [_parse_row(r, reader.line_num, file) for r in reader]
        except csv.Error as e:
            raise SpecError(
                f"cannot parse: {e}", file=file, field=f"line {reader.line_num}"
            ) from None
        return cls(rows, [file] * len(rows))


def load_profiles(paths: Iterable[str | Path]) -> ProfileTable:
    """Rows of several profile files in one table (later files may add GPU types)."""
    tables = [ProfileTable.load(p) for p in paths]
    return ProfileTable((r for t in tables for r in t.rows), (f for t in tables for f in t.files))


def _parse_row(r: dict[str, str], line: int, file: str) -> ProfileRow:
    try:
        row = ProfileRow(
            r["gpu"],
            r["model"],
            int(r["seq_len"]),
            r["layer"],
            int(r["mbs"]),
            float(r["fwd_s"]),
            float(r["bwd_s"]),
            int(float(r["act_bytes"])),
        )
    except (TypeError, ValueError, OverflowError) as e:
        raise SpecError(f"bad value ({e})", file=file, field=f"line {line}") from None
    if row.layer not in LAYER_KINDS:
        raise SpecError(
            f"layer {row.layer!r}: expected one of {', '.join(LAYER_KINDS)}",
            file=file,
            field=f"line {line}",
        )
    times = (row.fwd_s, row.bwd_s)
    if row.mbs <= 0 or row.seq_len <= 0 or not all(math.isfinite(t) and t >= 0 for t in times):
        raise SpecError(
            "seq_len and mbs must be positive and fwd_s, bwd_s finite and non-negative",
            file=file,
            field=f"line {line}",
        )
    if row.act_bytes < 0:
        raise SpecError("act_bytes must be non-negative", file=file, field=f"line {line}")
    return row
