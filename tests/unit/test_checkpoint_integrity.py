"""Checkpoint integrity (issue 9): a file that is damaged, swapped, of another shape or not
finite is refused by name; NaN weights are never saved; a write interrupted at any point (a
killed rank, a power loss) leaves the last complete checkpoint as the one that is read."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hetpp.runtime import checkpoint
from hetpp.runtime.checkpoint_meta import check_resumable
from hetpp.runtime.guards import NonFiniteError, check_step
from hetpp.runtime.model import StageModule
from hetpp.runtime.optim import make_optimizer
from hetpp.runtime.options import TrainOptions
from hetpp.specs import PRESETS, SpecError

C = PRESETS["tiny-gpt"]
MODEL = C.model_dump(mode="json")
OPTS = TrainOptions(plan="unused.json", fp64=True)


def _model(seed: int = 0):
    model = StageModule(C, 0, 6, seed=seed, dtype=torch.float64)
    return model, make_optimizer(model.parameters(), OPTS)


def _save(root, step: int, model, opt):
    meta = checkpoint.CheckpointMeta(
        step=step, samples=8 * step, seed=0, optimizer="adamw", model=MODEL
    )
    return checkpoint.save(root, meta, model, opt, list(range(6)), rank=0, barrier=lambda: None)


def _load(path, start: int = 0, end: int = 6):
    stage = StageModule(C, start, end, seed=1, dtype=torch.float64)
    checkpoint.load(path, stage, make_optimizer(stage.parameters(), OPTS))
    return stage


def test_meta_records_every_file_with_its_identity(tmp_path):
    path = _save(tmp_path, 1, *_model())
    meta = checkpoint.read_meta(path)
    assert sorted(meta.files) == [f"layer_{i:04d}.pt" for i in range(6)]
    kinds = [meta.files[f"layer_{i:04d}.pt"].kind for i in range(6)]
    assert kinds == ["embedding", "block", "block", "block", "block", "head"]
    assert meta.files["layer_0000.pt"].shapes["tok.weight"] == (256, 64)
    assert not list(path.glob("*.json.*")) and not list(path.glob("*.pt.json"))


def test_a_swapped_layer_file_is_refused(tmp_path):
    path = _save(tmp_path, 1, *_model())
    a, b = path / "layer_0002.pt", path / "layer_0003.pt"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    with pytest.raises(SpecError, match=r"layer_0002\.pt: checksum does not match"):
        _load(path, 2, 4)
    # With the record rewritten to match, the file's own identity still gives it away.
    meta = json.loads((path / "meta.json").read_text())
    meta["files"]["layer_0002.pt"]["sha256"] = checkpoint.sha256(data_b)
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SpecError, match=r"layer_0002\.pt: holds layer 3, expected layer 2"):
        _load(path, 2, 4)


def test_a_format_1_checkpoint_without_records_still_loads(tmp_path):
    model, opt = _model()
    path = _save(tmp_path, 1, model, opt)
    meta = json.loads((path / "meta.json").read_text())
    meta["format"] = 1
    del meta["files"]
    (path / "meta.json").write_text(json.dumps(meta))
    stage = _load(path)
    assert torch.equal(stage.layer(2).attn.qkv.weight, model.layer(2).attn.qkv.weight)


def test_nan_weights_are_never_saved(tmp_path):
    good = _save(tmp_path, 1, *_model())
    model, opt = _model()
    with torch.no_grad():
        model.layer(3).attn.qkv.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"layer_0003\.pt are NaN or infinite"):
        _save(tmp_path, 2, model, opt)
    assert checkpoint.latest(tmp_path) == good


def test_nan_weights_in_a_file_are_refused_on_load(tmp_path):
    path = _save(tmp_path, 1, *_model())
    state = torch.load(path / "layer_0001.pt", weights_only=True)
    next(iter(state["params"].values()))[0] = float("inf")
    torch.save(state, path / "layer_0001.pt")
    meta = json.loads((path / "meta.json").read_text())
    meta["files"]["layer_0001.pt"]["sha256"] = checkpoint.sha256(
        (path / "layer_0001.pt").read_bytes()
    )
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SpecError, match=r"layer_0001\.pt: holds NaN or infinite weights"):
        _load(path, 0, 3)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "meta.json: cannot parse"),
        ("[]", "meta.json: expected a mapping"),
        ('{"step": -1}', "meta.json: "),
        (b"\xff\xfe", "meta.json: not UTF-8"),
        (None, "meta.json: file not found"),
    ],
)
def test_a_broken_meta_json_is_one_clear_error(tmp_path, text, words):
    path = _save(tmp_path, 1, *_model())
    if text is None:
        (path / "meta.json").unlink()
    else:
        (path / "meta.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SpecError, match=words):
        check_resumable(path, MODEL, "adamw", 0)


def test_resume_checks_optimizer_seed_and_records(tmp_path):
    path = _save(tmp_path, 1, *_model())
    with pytest.raises(SpecError, match="--optimizer adamw --seed 0"):
        check_resumable(path, MODEL, "sgd", 0)
    meta = json.loads((path / "meta.json").read_text())
    del meta["files"]["layer_0004.pt"]
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SpecError, match=r"no record of layer_0004\.pt"):
        check_resumable(path, MODEL, "adamw", 0)


@pytest.mark.parametrize("crash", ["before-rename", "truncated-layer", "no-meta", "no-complete"])
def test_a_power_loss_during_a_write_keeps_the_last_complete_checkpoint(tmp_path, crash):
    """The machine stops at some point of writing step 2: what the disk then holds must resume
    from step 1, and the next write of step 2 must succeed."""
    model, opt = _model()
    first = _save(tmp_path, 1, model, opt)
    _save(tmp_path / "scratch", 2, model, opt)
    # The disk after the crash: step 2's temporary directory in some state of completion.
    tmp = tmp_path / ".tmp-step_00000002"
    shutil.copytree(tmp_path / "scratch" / "step_00000002", tmp)
    if crash == "truncated-layer":
        data = (tmp / "layer_0003.pt").read_bytes()
        (tmp / "layer_0003.pt").write_bytes(data[: len(data) // 2])
        (tmp / "COMPLETE").unlink()
    elif crash == "no-meta":
        (tmp / "meta.json").unlink()
        (tmp / "COMPLETE").unlink()
    elif crash == "no-complete":
        (tmp / "COMPLETE").unlink()
    assert checkpoint.latest(tmp_path) == first
    meta = check_resumable(first, MODEL, "adamw", 0)
    assert meta.step == 1
    _load(first)
    assert _save(tmp_path, 2, model, opt) == checkpoint.latest(tmp_path)
    assert not tmp.exists()


def test_a_rename_that_fails_keeps_the_last_complete_checkpoint(tmp_path, monkeypatch):
    model, opt = _model()
    first = _save(tmp_path, 1, model, opt)

    def power_loss(*args):
        raise OSError("power lost")

    monkeypatch.setattr(checkpoint, "_publish", power_loss)
    with pytest.raises(OSError, match="power lost"):
        _save(tmp_path, 2, model, opt)
    assert checkpoint.latest(tmp_path) == first


@pytest.mark.parametrize(
    ("loss", "norm", "words"),
    [
        (float("nan"), None, "step 7: loss nan"),
        (float("inf"), 1.0, "step 7: loss inf"),
        (1.0, float("nan"), "step 7: gradient norm nan"),
        (float("nan"), float("inf"), "loss nan and gradient norm inf"),
    ],
)
def test_a_non_finite_step_stops_the_run(loss, norm, words):
    with pytest.raises(NonFiniteError, match=words):
        check_step(7, loss, norm)
    check_step(7, 2.5, 0.1)  # finite: nothing happens
