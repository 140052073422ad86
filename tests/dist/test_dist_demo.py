"""The demo's runner on a real `hetpp train --emulate` run: progress per step, the step times,
the files it keeps, and a failed run's log in the error."""

from __future__ import annotations

import pytest
from disthelpers import pipeline

from hetpp.demo.emulated import builtin_cluster
from hetpp.demo.runs import TrainFailed, train_plan
from hetpp.specs import PRESETS, Plan

pytestmark = pytest.mark.dist


def tiny_plan(with_cluster: bool = True) -> Plan:
    """tiny-gpt on one Fast device (3 samples) and one Slow device (1 sample)."""
    pipes = (pipeline([0], [0, 6], 1, 3), pipeline([3], [0, 6], 1, 1))
    return Plan(
        global_batch=4,
        seq_len=16,
        pipelines=pipes,
        model=PRESETS["tiny-gpt"],
        cluster=builtin_cluster() if with_cluster else None,
        precision="fp32",
    ).validate_plan()


def test_a_run_reports_each_step_and_keeps_its_files(tmp_path):
    seen: list[int] = []
    summary = train_plan(tiny_plan(), 3, tmp_path, "tiny", on_step=lambda m: seen.append(m.step))
    assert seen == [1, 2, 3]
    assert len(summary["step_times_s"]) == 3 and min(summary["step_times_s"]) > 0
    assert summary["step_time_s"] > 0 and len(summary["compute_s"]) == 2
    assert {p.name for p in tmp_path.iterdir()} == {"tiny.json", "tiny.jsonl", "tiny.log"}


def test_a_failed_run_raises_with_its_log(tmp_path):
    with pytest.raises(TrainFailed, match="--emulate needs the plan's cluster"):
        train_plan(tiny_plan(with_cluster=False), 3, tmp_path, "bad")
