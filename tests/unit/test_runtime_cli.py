"""`hetpp train` and `hetpp profile` refuse bad input with one message and exit code 2, before
starting any rank."""

from __future__ import annotations

import pytest

from hetpp.cli.main import main
from hetpp.specs import PRESETS, PipelinePlan, Plan, StagePlan


@pytest.fixture
def plan_file(tmp_path):
    pipe = PipelinePlan(
        stages=(StagePlan(devices=(0,), layers=(0, 6)),), micro_batch_size=1, num_micro_batches=2
    )
    path = tmp_path / "plan.json"
    Plan(global_batch=2, seq_len=8, pipelines=(pipe,), model=PRESETS["tiny-gpt"]).save(path)
    return str(path)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--emulate"], "--emulate needs the plan's cluster"),
        (["--data", "no-such-file.txt"], "--data: file not found"),
        (["--resume"], "--resume: needs --checkpoint-dir"),
        (["--steps", "0"], "argument --steps: expected a positive integer"),
    ],
)
def test_train_refuses_bad_input(plan_file, extra, words, capsys):
    assert main(["train", "--plan", plan_file, *extra]) == 2
    assert words in capsys.readouterr().err


def test_train_names_a_missing_plan(tmp_path, capsys):
    assert main(["train", "--plan", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: file not found" in capsys.readouterr().err


def test_profile_refuses_a_sequence_longer_than_the_model(tmp_path, capsys):
    argv = ["profile", "--model", "tiny-gpt", "--seq-len", "4096", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "--seq-len: must be in 1..128" in capsys.readouterr().err
