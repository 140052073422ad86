"""Training basics: LR schedules through torch's LambdaLR, no weight decay on norms and biases,
TOML config files with command-line overrides, `hetpp --version`."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from hetpp.cli.main import main
from hetpp.runtime.model import StageModule
from hetpp.runtime.optim import lr_factor, make_optimizer, make_scheduler
from hetpp.runtime.options import TrainOptions, add_arguments, from_args
from hetpp.specs import PRESETS, SpecError


def _opts(**kw) -> TrainOptions:
    return TrainOptions(plan="p.json", **kw)


def test_warmup_then_cosine_linear_constant():
    cos = _opts(steps=10, warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.1)
    assert [lr_factor(s, cos) for s in (0, 1)] == [0.5, 1.0]
    assert lr_factor(2, cos) == 1.0 and lr_factor(10, cos) == pytest.approx(0.1)
    assert lr_factor(6, cos) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    lin = _opts(steps=10, warmup_steps=0, lr_schedule="linear", min_lr_ratio=0.0)
    assert [lr_factor(s, lin) for s in (0, 5, 10)] == [1.0, 0.5, 0.0]
    assert lr_factor(7, _opts(steps=10, warmup_steps=4)) == 1.0
    part = _opts(steps=4, decay_steps=8, lr_schedule="linear", min_lr_ratio=0.0)
    assert lr_factor(4, part) == 0.5  # a run stopping at 4 of a schedule over 8


def test_scheduler_drives_the_optimizer_and_resumes_in_place():
    opts = _opts(steps=6, lr=0.1, warmup_steps=2, lr_schedule="linear", min_lr_ratio=0.0)
    p = torch.nn.Parameter(torch.zeros(2, 2))
    opt = make_optimizer([p], opts)
    sched = make_scheduler(opt, opts, start=0)
    seen = []
    for _ in range(6):
        seen.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.1 * lr_factor(s, opts) for s in range(6)])
    again = make_scheduler(make_optimizer([p], opts), opts, start=4)  # as after a resume
    assert again.get_last_lr()[0] == pytest.approx(seen[4])


def test_no_weight_decay_on_norms_and_biases():
    stage = StageModule(PRESETS["tiny-gpt"], 0, 6, seed=0, dtype=torch.float32)
    opt = make_optimizer(stage.parameters(), _opts(weight_decay=0.1))
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decayed["params"])
    names = {id(p): n for n, p in stage.named_parameters()}
    assert {names[id(p)].rsplit(".", 1)[1] for p in plain["params"]} == {"weight", "bias"}
    assert all("norm" in names[id(p)] or names[id(p)].endswith("bias") for p in plain["params"])


def _parse(argv: list[str]) -> TrainOptions:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return from_args(p.parse_args(argv))


def test_config_file_with_command_line_overrides(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('plan = "plan.json"\nlr = 1\nsteps = 50\nemulate = true\nlr_schedule = "cosine"\n')
    opts = _parse(["--config", str(f), "--lr", "3e-4"])
    assert (opts.plan, opts.lr, opts.steps, opts.emulate, opts.lr_schedule) == (
        "plan.json",
        3e-4,
        50,
        True,
        "cosine",
    )


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ("learning_rate = 1", "learning_rate", "unknown option"),
        ('lr = "fast"', "lr", "valid number"),
        ("steps = 2.5", "steps", "valid integer"),
        ('fp64 = "yes"', "fp64", "valid boolean"),
        ("lr = [", None, "not valid TOML"),
    ],
)
def test_bad_config_files_name_the_key(tmp_path, body, field, message):
    f = tmp_path / "run.toml"
    f.write_text(f'plan = "p.json"\n{body}\n')
    with pytest.raises(SpecError, match=message) as e:
        _parse(["--config", str(f)])
    assert e.value.file == str(f) and e.value.field == field


def test_plan_is_required_somewhere():
    with pytest.raises(SpecError, match="required: a plan file"):
        _parse(["--lr", "1e-3"])


def test_version(capsys):
    assert main(["--version"]) == 0  # main returns argparse's exit code
    assert capsys.readouterr().out.startswith("hetpp 0.")


def test_tensorboard_events_beside_the_jsonl(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hetpp.runtime.metrics import MetricsLog, StepMetrics

    log = MetricsLog(tmp_path / "m.jsonl", append=False, tensorboard=str(tmp_path / "tb"))
    for step, val in ((1, None), (2, 2.5)):
        log.add(
            StepMetrics(
                step=step,
                loss=3.0 / step,
                step_s=0.1,
                samples_per_s=1.0,
                tokens_per_s=1.0,
                grad_norm=0.5,
                compute_s=(0.1,),
                wait_s=(0.0,),
                comm_s=(0.0,),
                lr=1e-3,
                val_loss=val,
            )
        )
    log.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.value for e in events.Scalars("train/loss")] == [3.0, 1.5]
    assert [(e.step, e.value) for e in events.Scalars("train/val_loss")] == [(2, 2.5)]
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 2
