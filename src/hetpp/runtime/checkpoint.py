"""Plan-independent checkpoints: one file per layer index, so any plan on any rank count resumes.

    CKPT_DIR/step_00000004/layer_0000.pt ... layer_0005.pt  {"params": {name: tensor},
                                                               "optim": {name: {state}}}
                          meta.json                         step, samples consumed, model, ...
                          COMPLETE                          written last

Writing is atomic: every rank writes its layers into `.tmp-step_N/` (fsynced), a barrier, then
rank 0 writes meta.json and COMPLETE and renames the directory to `step_N`. Readers take the newest
`step_N` with COMPLETE, so a run killed while writing never leaves a checkpoint that is read. Layers
are written by pipeline 0's owner (all pipelines hold identical copies after the gradient sync). A
tied weight is stored once, as the embedding's `tok.weight`. Ranks must share the directory (a
shared filesystem across nodes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hetpp.runtime.model import TIED_EMBEDDING_PARAM, StageModule
from hetpp.specs.errors import SpecError

FORMAT = 1
_STEP_DIR = re.compile(r"step_(\d{8})")


@dataclass(frozen=True, kw_only=True)
class CheckpointMeta:
    """What a run needs besides the weights to continue where it stopped."""

    step: int
    """Optimizer steps taken."""
    samples: int
    """Samples of the data stream consumed (the next step starts at this sample)."""
    seed: int
    """Seed of the run (synthetic data depends on it)."""
    optimizer: str
    """Optimizer kind whose state the layer files hold."""
    model: dict
    """The model config (a checkpoint only loads into the same architecture)."""


def layer_file(index: int) -> str:
    return f"layer_{index:04d}.pt"


def latest(ckpt_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in `ckpt_dir`, or None."""
    root = Path(ckpt_dir)
    found = [
        p for p in root.glob("step_*") if _STEP_DIR.fullmatch(p.name) and (p / "COMPLETE").exists()
    ]
    return max(found, key=lambda p: p.name, default=None)


def _fsync_write(path: Path, write: Callable) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _layer_state(stage: StageModule, opt: torch.optim.Optimizer, index: int) -> dict:
    params = dict(stage.own_parameters(index))
    return {
        "params": {n: p.detach().cpu() for n, p in params.items()},
        "optim": {
            n: {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
            for n, p in params.items()
            if p in opt.state
        },
    }


def save(
    ckpt_dir: str | Path,
    meta: CheckpointMeta,
    stage: StageModule,
    opt: torch.optim.Optimizer,
    layers: list[int],
    rank: int,
    barrier: Callable[[], None],
) -> Path:
    """Collective: every rank calls it; `layers` are the ones this rank writes (maybe none)."""
    root = Path(ckpt_dir)
    name = f"step_{meta.step:08d}"
    tmp, final = root / f".tmp-{name}", root / name
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run that died while writing
        tmp.mkdir(parents=True)
    barrier()
    for i in layers:
        state = _layer_state(stage, opt, i)
        _fsync_write(tmp / layer_file(i), lambda f, s=state: torch.save(s, f))
    barrier()
    if rank == 0:
        text = json.dumps({"format": FORMAT, **meta.__dict__}, indent=1).encode()
        _fsync_write(tmp / "meta.json", lambda f: f.write(text))
        _fsync_write(tmp / "COMPLETE", lambda f: f.write(b"ok\n"))
        _fsync_dir(tmp)
        if final.exists():  # the same step written again: replace it
            old = root / f".old-{name}"
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
        _fsync_dir(root)
    barrier()
    return final


def read_meta(path: str | Path) -> CheckpointMeta:
    data = json.loads((Path(path) / "meta.json").read_text())
    if data.pop("format", None) != FORMAT:
        raise SpecError(f"checkpoint format is not {FORMAT}", file=str(path))
    return CheckpointMeta(**data)


def _load_state(
    p: torch.nn.Parameter, opt: torch.optim.Optimizer, value: torch.Tensor, state: dict | None
) -> None:
    with torch.no_grad():
        p.copy_(value)
    if state is not None:
        # Moments follow the parameter's device and dtype; scalars (Adam's step) stay on the CPU.
        opt.state[p] = {
            k: v.to(p.device, p.dtype) if torch.is_tensor(v) and v.ndim else v
            for k, v in state.items()
        }


def _read_layer(root: Path, index: int) -> dict:
    path = root / layer_file(index)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # missing, truncated or not a layer file: say which file
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise SpecError(f"unreadable layer file ({first.strip()})", file=str(path)) from None


def load(path: str | Path, stage: StageModule, opt: torch.optim.Optimizer) -> CheckpointMeta:
    """Load the stage's layers (weights and optimizer state) from a complete checkpoint."""
    root = Path(path)
    meta = read_meta(root)
    if meta.model != stage.config.model_dump(mode="json"):
        raise SpecError("the checkpoint is for a different model than the plan's", file=str(root))
    for i in range(stage.start, stage.end):
        data = _read_layer(root, i)
        for name, p in stage.own_parameters(i):
            _load_state(p, opt, data["params"][name], data["optim"].get(name))
    tied = stage.tied_weight()
    if tied is not None and stage.start != 0:  # a head holding its own copy of the tied weight
        data = _read_layer(root, 0)
        state = data["optim"].get(TIED_EMBEDDING_PARAM)
        _load_state(tied, opt, data["params"][TIED_EMBEDDING_PARAM], state)
    return meta
