"""`hetpp train` and `hetpp profile` refuse bad input with one message and exit code 2, before
starting any rank."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetpp.cli.main import main
from hetpp.runtime.contract import describe
from hetpp.specs import PRESETS, PipelinePlan, Plan, StagePlan
from hetpp.specs.schedule import SCHEDULES


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


@pytest.mark.parametrize(
    ("train", "extra", "words"),
    [
        ({"grad_bytes_per_param": 3}, [], "train.grad_bytes_per_param: 3: the runtime all-reduces"),
        ({"precision": "bf16"}, ["--fp64"], "train.precision: --fp64 runs an fp32 plan"),
    ],
)
def test_train_refuses_a_plan_it_cannot_execute(tmp_path, train, extra, words, capsys):
    pipe = PipelinePlan(
        stages=(StagePlan(devices=(0,), layers=(0, 6)),), micro_batch_size=1, num_micro_batches=2
    )
    path = tmp_path / "plan.json"
    Plan(global_batch=2, seq_len=8, pipelines=(pipe,), model=PRESETS["tiny-gpt"], **train).save(
        path
    )
    # Refused in the launcher, before any rank process exists: one line naming file and field.
    assert main(["train", "--plan", str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and str(path) in err and len(err.strip().splitlines()) == 1


def _two_pipelines(tmp_path, schedule: str, m: int) -> str:
    """Pipeline 0: 1F1B on device 0; pipeline 1: `schedule` with two stages on each of devices
    1 and 2 (its placement; one-chunk schedules: one on each of devices 1-4) and `m`
    micro-batches."""
    one = PipelinePlan(
        stages=(StagePlan(devices=(0,), layers=(0, 6)),), micro_batch_size=1, num_micro_batches=2
    )
    spec = SCHEDULES[schedule]
    num = 4 if spec.placement == "one" else 2
    stages = tuple(
        StagePlan(devices=(1 + spec.device_index(s, num),), layers=(a, b))
        for s, (a, b) in enumerate([(0, 2), (2, 3), (3, 5), (5, 6)])
    )
    two = PipelinePlan(stages=stages, micro_batch_size=1, num_micro_batches=m, schedule=schedule)
    path = tmp_path / "plan.json"
    Plan(global_batch=2 + m, seq_len=8, pipelines=(one, two), model=PRESETS["tiny-gpt"]).save(path)
    return str(path)


def test_train_refuses_a_schedule_the_runtime_does_not_execute(tmp_path, monkeypatch, capsys):
    # A registry entry not marked executable (as a schedule added for planning only would be).
    monkeypatch.setitem(SCHEDULES, "zbv", replace(SCHEDULES["zbv"], executable=False))
    path = _two_pipelines(tmp_path, "zbv", 4)
    assert main(["train", "--plan", path]) == 2
    err = capsys.readouterr().err
    assert "pipelines[1].schedule: zbv: the runtime does not execute this schedule" in err
    assert path in err and len(err.strip().splitlines()) == 1


def test_train_refuses_micro_batches_torchs_interleaving_cannot_split_into_rounds(tmp_path, capsys):
    # 5 micro-batches on 2 devices: torch runs 5 // 2 = 2 rounds, and 5 is not a multiple of 2.
    path = _two_pipelines(tmp_path, "interleaved-1f1b", 5)
    assert main(["train", "--plan", path]) == 2
    err = capsys.readouterr().err
    want = "pipelines[1].num_micro_batches: interleaved-1f1b needs num_micro_batches a multiple"
    assert want in err, err


@pytest.mark.parametrize("schedule", ["zbv", "zbh1", "interleaved-1f1b"])
def test_the_preflight_takes_a_memory_report_of_a_multi_stage_plan(tmp_path, schedule):
    # the meter counts what a split backward's I keeps for its W and a rank's stages together
    # (tests/dist/test_dist_memory.py compares them with the cost model)
    from hetpp.runtime.options import TrainOptions
    from hetpp.runtime.preflight import check_run
    from hetpp.specs.plan import load_plan

    path = _two_pipelines(tmp_path, schedule, 4)
    assert check_run(TrainOptions(plan=path, memory_report=True), load_plan(path)) == []


def test_rank_0_says_what_it_executes():
    stages = (
        StagePlan(devices=(1,), layers=(0, 2), recompute=True),
        StagePlan(devices=(0,), layers=(2, 6)),
    )
    pipe = PipelinePlan(stages=stages, micro_batch_size=1, num_micro_batches=2)
    plan = Plan(global_batch=2, seq_len=8, pipelines=(pipe,), model=PRESETS["tiny-gpt"])
    assert describe(plan, "bf16: how") == [
        "hetpp train: tiny-gpt, 2 ranks, schedule 1f1b",
        "  precision bf16: how",
        "  pipeline 0: devices [1, 0], layers [0, 2), [2, 6), batch 2 (2 x 1), "
        "recompute stages [0]",
    ]


def test_train_names_a_missing_plan(tmp_path, capsys):
    assert main(["train", "--plan", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: file not found" in capsys.readouterr().err


def test_profile_refuses_a_sequence_longer_than_the_model(tmp_path, capsys):
    argv = ["profile", "--model", "tiny-gpt", "--seq-len", "4096", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "--seq-len: must be in 1..128" in capsys.readouterr().err


def test_precision_says_what_it_runs():
    from hetpp.runtime.precision import Precision

    pipe = PipelinePlan(
        stages=(StagePlan(devices=(0,), layers=(0, 6)),), micro_batch_size=1, num_micro_batches=2
    )

    def plan(**train):
        return Plan(
            global_batch=2, seq_len=8, pipelines=(pipe,), model=PRESETS["tiny-gpt"], **train
        )

    assert Precision.of(plan()).describe() == (
        "bf16: torch.autocast(bfloat16) forward, float32 master weights and gradients, "
        "bfloat16 gradient all-reduces"
    )
    assert (
        Precision.of(plan(precision="fp16", grad_bytes_per_param=4))
        .describe()
        .endswith("float32 gradient all-reduces, dynamic loss scaling (global inf/NaN check)")
    )
    assert Precision.of(plan(precision="fp32"), fp64=True).describe() == (
        "fp64: weights, activations and gradients in float64, float64 gradient all-reduces"
    )


def _bf16_two_pipelines(sharding: str, master_weights: str) -> Plan:
    pipes = tuple(
        PipelinePlan(
            stages=(StagePlan(devices=(d,), layers=(0, 6)),),
            micro_batch_size=1,
            num_micro_batches=1,
        )
        for d in (0, 1)
    )
    return Plan(
        version=2,
        pipelines=pipes,
        model=PRESETS["tiny-llama"],
        sharding=sharding,
        train={"global_batch": 2, "seq_len": 8, "master_weights": master_weights},
    )


def test_sharded_mixed_precision_runs_with_its_masters_in_the_optimizer():
    from hetpp.runtime.contract import check_executable
    from hetpp.specs.errors import SpecError

    # fp32 parameters as the masters would stay whole on every owner: refused.
    with pytest.raises(SpecError, match="sharding: optimizer: a sharded bf16 plan needs"):
        check_executable(_bf16_two_pipelines("optimizer", "params"))
    for sharding in ("optimizer", "none"):
        check_executable(_bf16_two_pipelines(sharding, "optimizer"))
        check_executable(_bf16_two_pipelines(sharding, "optimizer"), fp64=True)
    with pytest.raises(SpecError, match=r"train\.master_weights: .* not built for sharding 'full'"):
        check_executable(_bf16_two_pipelines("full", "optimizer"))
