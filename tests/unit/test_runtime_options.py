"""Training options: the launcher's argv reproduces them; bad values name the flag."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from hetpp.runtime.options import TrainOptions, add_arguments, from_args
from hetpp.specs import SpecError


def _parse(argv: list[str]) -> TrainOptions:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return from_args(p.parse_args(argv))


def test_argv_round_trip():
    opts = TrainOptions(
        plan="p.json",
        steps=7,
        data="d.txt",
        fp64=True,
        optimizer="sgd",
        lr=0.5,
        clip_grad=1.0,
        emulate=True,
        verify=True,
        verify_tol=1e-3,
        checkpoint_dir="ck",
        checkpoint_every=2,
        resume=True,
        metrics="m.jsonl",
        timeout_s=12.5,
        weight_decay=0.1,
        seed=3,
    )
    assert _parse(opts.to_argv()) == opts
    assert _parse(["--plan", "p.json"]) == TrainOptions(plan="p.json")


def test_default_verify_tolerance_follows_the_precision():
    assert TrainOptions(plan="p").tolerance("fp32") == 1e-5
    assert TrainOptions(plan="p").tolerance("fp64") == 1e-10
    assert TrainOptions(plan="p", verify_tol=0.1).tolerance("bf16") == 0.1


@pytest.mark.parametrize(
    ("kw", "flag"),
    [
        ({"steps": 0}, "--steps"),
        ({"lr": -1.0}, "--lr"),
        ({"lr": float("inf")}, "--lr"),
        ({"clip_grad": 0.0}, "--clip-grad"),
        ({"resume": True}, "--resume"),
        ({"timeout_s": 0.0}, "--timeout-s"),
        ({"timeout_s": 1e9}, "--timeout-s"),
        ({"checkpoint_every": -1}, "--checkpoint-every"),
        ({"weight_decay": float("nan")}, "--weight-decay"),
        ({"verify_tol": -1e-5}, "--verify-tol"),
        ({"seed": 2**64}, "--seed"),
    ],
)
def test_bad_values_name_the_flag(kw, flag):
    """The dataclass checks what the parser's types check, for callers that skip the parser."""
    with pytest.raises(SpecError, match=flag):
        TrainOptions(plan="p.json", **kw)


def test_command_registration_does_not_import_torch():
    code = (
        "import sys, argparse\n"
        "import hetpp.cli.train, hetpp.cli.profile, hetpp.runtime.launch, hetpp.runtime.metrics\n"
        "sub = argparse.ArgumentParser().add_subparsers()\n"
        "hetpp.cli.train.register(sub); hetpp.cli.profile.register(sub)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
