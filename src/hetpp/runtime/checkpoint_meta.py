"""A checkpoint's metadata and integrity record, readable without torch (the launcher checks a
checkpoint before it starts any rank, so a broken one gives one message, not one per rank).

`meta.json` holds the run's position (step, samples, seed, optimizer, model) and, per layer file,
its SHA-256 and identity (layer index, kind, parameter shapes): a file that was damaged, swapped
with another layer's, or belongs to another model is refused by name before any weight is used.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, NonNegativeInt

from hetpp.specs.errors import SpecError
from hetpp.specs.io import parse_mapping, read_text, validate_model
from hetpp.specs.model import ModelConfig

FORMAT = 2
"""2: per-file checksums and layer identities in `files`. Format 1 (no `files`) still loads."""
CHECKSUM_MISMATCH = "checksum does not match meta.json (damaged or replaced)"
_STEP_DIR = re.compile(r"step_(\d{8})")


class LayerRecord(BaseModel):
    """What one layer file must hold."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str
    """Hex digest of the file's bytes."""
    layer: NonNegativeInt
    """Index in the model's layer list."""
    kind: str
    """embedding, block or head."""
    shapes: dict[str, tuple[int, ...]]
    """Shape of every parameter the file stores, by name."""


class CheckpointMeta(BaseModel):
    """What a run needs besides the weights to continue where it stopped."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: int = FORMAT
    """Checkpoint format version."""
    step: NonNegativeInt
    """Optimizer steps taken."""
    samples: NonNegativeInt
    """Samples of the data stream consumed (the next step starts at this sample)."""
    seed: NonNegativeInt
    """Seed of the run (synthetic data depends on it)."""
    optimizer: str
    """Optimizer kind whose state the layer files hold."""
    model: dict
    """The model config (a checkpoint only loads into the same architecture)."""
    files: dict[str, LayerRecord] = {}
    """Integrity record per layer file (empty in format 1)."""


def layer_file(index: int) -> str:
    return f"layer_{index:04d}.pt"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def latest(ckpt_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in `ckpt_dir`, or None."""
    root = Path(ckpt_dir)
    found = [
        p for p in root.glob("step_*") if _STEP_DIR.fullmatch(p.name) and (p / "COMPLETE").exists()
    ]
    return max(found, key=lambda p: p.name, default=None)


def read_meta(path: str | Path) -> CheckpointMeta:
    """The checkpoint's meta.json, validated; SpecError naming the file otherwise."""
    file = str(Path(path) / "meta.json")
    meta = validate_model(CheckpointMeta, parse_mapping(read_text(file), file, True), file)
    if meta.format not in (1, FORMAT):
        raise SpecError(f"format {meta.format}; this hetpp reads 1 and {FORMAT}", file=file)
    return meta


def check_resumable(path: Path, model: dict, optimizer: str, seed: int) -> CheckpointMeta:
    """The checkpoint's metadata if a run of `model` with `optimizer` and `seed` can resume from
    it (every layer file recorded), else SpecError naming the file and the mismatch."""
    meta = read_meta(path)
    if meta.model != model:
        raise SpecError("the checkpoint is for a different model than the plan's", file=str(path))
    if meta.optimizer != optimizer or meta.seed != seed:
        raise SpecError(
            f"the checkpoint was trained with --optimizer {meta.optimizer} --seed "
            f"{meta.seed}; resume with the same",
            file=str(path),
        )
    if meta.format >= 2:
        want = {layer_file(i) for i in range(ModelConfig.model_validate(model).layer_list_len)}
        missing = sorted(want - set(meta.files))
        if missing:
            raise SpecError(f"no record of {missing[0]}", file=str(Path(path) / "meta.json"))
    return meta


def check_files(path: Path) -> None:
    """SpecError naming the first layer file that is missing or whose bytes do not match its
    recorded checksum. The launcher runs it once, before any rank starts, so a damaged file is
    one message (the rank loading it would check it again, and the others would only see a
    lost peer)."""
    meta = read_meta(path)
    for name, record in sorted(meta.files.items()):
        file = Path(path) / name
        digest = hashlib.sha256()
        try:
            with open(file, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
        except OSError as e:
            raise SpecError(f"cannot read ({e.strerror or e})", file=str(file)) from None
        if digest.hexdigest() != record.sha256:
            raise SpecError(
                "checksum does not match meta.json (damaged or replaced)", file=str(file)
            )
