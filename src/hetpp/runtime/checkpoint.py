"""Plan-independent checkpoints: one file per layer index, so any plan on any rank count resumes.

    CKPT_DIR/step_00000004/layer_0000.pt ... layer_0005.pt  {"layer": i, "params": {name: tensor},
                                                               "optim": {name: {state}}}
                          meta.json                         step, samples, model, and per file
                                                            its SHA-256, index, kind and shapes
                          COMPLETE                          written last

Writing is atomic: every rank writes its layers into `.tmp-step_N/` (fsynced), each with a small
`.json` record beside it; a barrier; every rank reads the records (so if any weight is NaN or
infinite, all of them stop together and no checkpoint is written); a barrier; then rank 0 folds
the records into meta.json, writes COMPLETE and renames the directory to `step_N`. Readers take
the newest `step_N` with COMPLETE, so a run killed (or a machine losing power) while writing
never leaves a checkpoint that is read. Layers are written by pipeline 0's owner (all pipelines
hold identical copies after the gradient sync). A tied weight is stored once, as the embedding's
`tok.weight`. Ranks must share the directory (a shared filesystem across nodes).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from hetpp.runtime.checkpoint_meta import (
    CHECKSUM_MISMATCH,
    CheckpointMeta,
    LayerRecord,
    latest,
    layer_file,
    read_meta,
    sha256,
)
from hetpp.runtime.guards import NonFiniteError
from hetpp.runtime.model import TIED_EMBEDDING_PARAM, RankModel, StageModule
from hetpp.runtime.shard import WholeState
from hetpp.runtime.tp import GatheredStage, like
from hetpp.specs.errors import SpecError

__all__ = ["CheckpointMeta", "latest", "load", "read_meta", "save"]


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


Stage = StageModule | RankModel | GatheredStage
"""What `save` reads the layers of (a TP stage: gathered first, `tp.GatheredStage`)."""

State = torch.optim.Optimizer | WholeState | GatheredStage
"""Where a checkpoint's optimizer state is read from and loaded into: an optimizer stepping the
parameters themselves, their whole state (`runtime.shard`: gathered from shards, or keyed
from fp32 masters, whose values are stored in the half-precision parameters' place), or a TP
stage's gathered state."""


def _layer_state(stage: Stage, opt: State, index: int) -> dict:
    params = dict(stage.own_parameters(index))
    values = opt.values if isinstance(opt, WholeState) else {}
    return {
        "layer": index,
        "params": {n: values.get(p, p).detach().cpu() for n, p in params.items()},
        "optim": {
            n: {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
            for n, p in params.items()
            if p in opt.state
        },
    }


def _write_layer(tmp: Path, stage: Stage, opt: State, index: int) -> None:
    state = _layer_state(stage, opt, index)
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    record = LayerRecord(
        sha256=sha256(data),
        layer=index,
        kind=stage.config.layer_kind(index),
        shapes={n: tuple(t.shape) for n, t in state["params"].items()},
    )
    finite = all(bool(torch.isfinite(t).all()) for t in state["params"].values())
    _fsync_write(tmp / layer_file(index), data)
    side = {"record": record.model_dump(mode="json"), "finite": finite}
    _fsync_write(tmp / f"{layer_file(index)}.json", json.dumps(side).encode())


def save(
    ckpt_dir: str | Path,
    meta: CheckpointMeta,
    stage: Stage,
    opt: State,
    layers: list[int],
    rank: int,
    barrier: Callable[[], None],
) -> Path:
    """Collective: every rank calls it; `layers` are the ones this rank writes (maybe none).
    Raises NonFiniteError on every rank, and writes no checkpoint, if any weight is NaN or inf."""
    root = Path(ckpt_dir)
    name = f"step_{meta.step:08d}"
    tmp, final = root / f".tmp-{name}", root / name
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run that died while writing
        tmp.mkdir(parents=True)
    barrier()
    for i in layers:
        _write_layer(tmp, stage, opt, i)
    barrier()
    sides = {p.name.removesuffix(".json"): json.loads(p.read_text()) for p in tmp.glob("*.pt.json")}
    barrier()  # every rank has read the records before rank 0 folds them into meta.json
    bad = sorted(f for f, s in sides.items() if not s["finite"])
    if bad:
        raise NonFiniteError(
            f"step {meta.step}: weights in {', '.join(bad)} are NaN or infinite; the checkpoint "
            f"is not written (the last complete one in {root} stays)"
        )
    if rank == 0:
        files = {f: LayerRecord(**s["record"]) for f, s in sorted(sides.items())}
        text = meta.model_copy(update={"files": files}).model_dump_json(indent=1).encode()
        for f in sides:
            (tmp / f"{f}.json").unlink()
        _fsync_write(tmp / "meta.json", text)
        _fsync_write(tmp / "COMPLETE", b"ok\n")
        _fsync_dir(tmp)
        _publish(root, tmp, final)
    barrier()
    return final


def _publish(root: Path, tmp: Path, final: Path) -> None:
    """Rename the finished temporary directory into place (replacing the same step's)."""
    if final.exists():
        old = root / f".old-{final.name}"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)
    _fsync_dir(root)


def _load_state(
    stage: StageModule,
    name: str,
    p: torch.nn.Parameter,
    opt: State,
    value: torch.Tensor,
    state: dict | None,
) -> None:
    """Parameter `name` of `stage` and its optimizer state from the files' unsharded tensors
    (a TP shard takes its part, `tp.like`; half-precision parameters also fill their fp32
    masters, `WholeState.values`)."""
    with torch.no_grad():
        p.copy_(like(p, name, value.to(p.device, p.dtype), stage.config))
    # Moments follow the parameter's device, dtype (a master's, for fp32 masters of
    # half-precision parameters) and sharding; scalars (Adam's step) stay on the CPU.
    dtype = opt.dtype if isinstance(opt, WholeState) and opt.dtype is not None else p.dtype
    if isinstance(opt, WholeState):
        opt.values[p] = value.to(p.device, dtype)
    if state is not None:
        opt.state[p] = {
            k: like(p, name, v.to(p.device, dtype), stage.config)
            if torch.is_tensor(v) and v.ndim
            else v
            for k, v in state.items()
        }


def _read_layer(root: Path, index: int, meta: CheckpointMeta) -> dict:
    """Layer `index`'s state after checking the file against its record: SpecError naming the
    file when it is missing, damaged, another layer's, or holds non-finite weights."""
    path = root / layer_file(index)
    record = meta.files.get(layer_file(index))
    try:
        raw = path.read_bytes()
        if record is not None and sha256(raw) != record.sha256:
            raise SpecError(CHECKSUM_MISMATCH)
        data = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except SpecError as e:
        raise e.in_file(str(path)) from None
    except Exception as e:  # missing, truncated or not a layer file: say which file
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise SpecError(f"unreadable layer file ({first.strip()})", file=str(path)) from None
    if not isinstance(data, dict) or data.get("layer", index) != index:
        found = data.get("layer") if isinstance(data, dict) else type(data).__name__
        raise SpecError(f"holds layer {found}, expected layer {index}", file=str(path))
    if not all(bool(torch.isfinite(t).all()) for t in data["params"].values()):
        raise SpecError("holds NaN or infinite weights", file=str(path))
    return data


def _check_shape(path: Path, name: str, p: torch.nn.Parameter, value: torch.Tensor) -> None:
    if tuple(value.shape) != tuple(p.shape):
        raise SpecError(
            f"parameter {name} has shape {tuple(value.shape)}, expected {tuple(p.shape)}",
            file=str(path),
        )


def load(path: str | Path, stage: StageModule, opt: State) -> CheckpointMeta:
    """Load the stage's layers (weights and optimizer state) from a complete checkpoint."""
    root = Path(path)
    meta = read_meta(root)
    if meta.model != stage.config.model_dump(mode="json"):
        raise SpecError("the checkpoint is for a different model than the plan's", file=str(root))
    for i in range(stage.start, stage.end):
        data = _read_layer(root, i, meta)
        for name, p in stage.own_parameters(i):
            if name not in data["params"]:
                raise SpecError(f"parameter {name} is missing", file=str(root / layer_file(i)))
            _check_shape(root / layer_file(i), name, p, data["params"][name])
            _load_state(stage, name, p, opt, data["params"][name], data["optim"].get(name))
    tied = stage.tied_weight()
    if tied is not None and stage.start != 0:  # a head holding its own copy of the tied weight
        data = _read_layer(root, 0, meta)
        value = data["params"][TIED_EMBEDDING_PARAM]
        _check_shape(root / layer_file(0), TIED_EMBEDDING_PARAM, tied, value)
        _load_state(
            stage, TIED_EMBEDDING_PARAM, tied, opt, value, data["optim"].get(TIED_EMBEDDING_PARAM)
        )
    return meta
