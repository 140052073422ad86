"""Checkpoints are keyed by layer, load into any stage cut, and are never read half-written."""

from __future__ import annotations

import pytest
import torch

from hetpp.runtime import checkpoint
from hetpp.runtime.model import StageModule, token_loss_sum
from hetpp.runtime.optim import make_optimizer
from hetpp.runtime.options import TrainOptions
from hetpp.specs import PRESETS, SpecError

C = PRESETS["tiny-gpt"]
OPTS = TrainOptions(plan="unused.json", fp64=True)


def _trained_full_model() -> tuple[StageModule, torch.optim.Optimizer]:
    model = StageModule(C, 0, 6, seed=0, dtype=torch.float64)
    opt = make_optimizer(model.parameters(), OPTS)
    x = torch.randint(0, 256, (2, 8))
    token_loss_sum(model(x), x).backward()
    opt.step()
    return model, opt


def _meta(step: int, model=C) -> checkpoint.CheckpointMeta:
    return checkpoint.CheckpointMeta(
        step=step, samples=8 * step, seed=0, optimizer="adamw", model=model.model_dump(mode="json")
    )


def _save(tmp_path, step: int, model, opt) -> None:
    # One process plays every rank: it writes all layers, and barriers are no-ops.
    checkpoint.save(tmp_path, _meta(step), model, opt, list(range(6)), rank=0, barrier=lambda: None)


def test_a_checkpoint_loads_into_a_different_stage_cut(tmp_path):
    full, opt = _trained_full_model()
    _save(tmp_path, 1, full, opt)
    path = checkpoint.latest(tmp_path)
    assert path is not None and checkpoint.read_meta(path).samples == 8
    head_stage = StageModule(C, 3, 6, seed=9, dtype=torch.float64)  # other seed: load must win
    head_opt = make_optimizer(head_stage.parameters(), OPTS)
    checkpoint.load(path, head_stage, head_opt)
    for i in range(3, 6):
        for name, p in head_stage.layer(i).named_parameters(remove_duplicate=False):
            assert torch.equal(p, full.layer(i).get_parameter(name)), (i, name)
    # The head's own copy of the tied weight comes from the embedding's file, state included.
    tied, source = head_stage.tied_weight(), full.layer(0).tok.weight
    assert torch.equal(tied, source)
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(head_opt.state[tied][key], opt.state[source][key])


def test_partial_checkpoints_are_never_read(tmp_path):
    full, opt = _trained_full_model()
    _save(tmp_path, 2, full, opt)
    (tmp_path / ".tmp-step_00000004").mkdir()  # a writer died before the rename
    (tmp_path / ".tmp-step_00000004" / "layer_0000.pt").write_bytes(b"partial")
    (tmp_path / "step_00000006").mkdir()  # renamed by hand, no COMPLETE marker
    assert checkpoint.latest(tmp_path).name == "step_00000002"
    _save(tmp_path, 4, full, opt)  # the same step again replaces the stale temporary directory
    assert checkpoint.latest(tmp_path).name == "step_00000004"
    assert not (tmp_path / ".tmp-step_00000004").exists()
    assert checkpoint.latest(tmp_path / "missing") is None


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    full, opt = _trained_full_model()
    _save(tmp_path, 1, full, opt)
    other = PRESETS["tiny-llama"]
    stage = StageModule(other, 0, 6, seed=0, dtype=torch.float64)
    with pytest.raises(SpecError, match="different model"):
        checkpoint.load(
            checkpoint.latest(tmp_path), stage, make_optimizer(stage.parameters(), OPTS)
        )


def test_a_damaged_layer_file_is_named(tmp_path):
    full, opt = _trained_full_model()
    _save(tmp_path, 1, full, opt)
    (checkpoint.latest(tmp_path) / "layer_0002.pt").write_bytes(b"damaged")
    stage = StageModule(C, 2, 4, seed=0, dtype=torch.float64)
    with pytest.raises(SpecError, match=r"layer_0002\.pt: checksum does not match"):
        checkpoint.load(
            checkpoint.latest(tmp_path), stage, make_optimizer(stage.parameters(), OPTS)
        )
