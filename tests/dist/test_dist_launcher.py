"""`hetpp train` end to end: the local launcher starts one process per device, here emulating a
cluster whose second GPU type is 3x slower, and verifies the result."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from hetpp.runtime import checkpoint
from hetpp.runtime.metrics import load_metrics, summarize
from hetpp.runtime.model import StageModule
from hetpp.runtime.optim import make_optimizer
from hetpp.runtime.options import TrainOptions
from hetpp.specs import PRESETS, Cluster, PipelinePlan, Plan, StagePlan

pytestmark = pytest.mark.dist


def emulated_cluster() -> Cluster:
    """Device 0: an H100; device 1: a made-up type that emulation runs 3x slower."""
    return Cluster.model_validate(
        {
            "name": "fast-slow",
            "gpu_types": [
                {
                    "name": "Slow",
                    "bf16_tflops": 300,
                    "memory_gb": 80,
                    "mem_bw_GBps": 2000,
                    "emulate_slowdown": 3,
                }
            ],
            "nodes": [
                {"gpu": "H100-80GB", "gpus_per_node": 1, "intra_node_GBps": 300},
                {"gpu": "Slow", "gpus_per_node": 1, "intra_node_GBps": 300},
            ],
            "inter_node_GBps": 25,
        }
    )


def test_hetpp_train_runs_the_ranks_and_verifies(tmp_path):
    def one_stage(device: int, mbs: int, m: int) -> PipelinePlan:
        stage = StagePlan(devices=(device,), layers=(0, 6))
        return PipelinePlan(stages=(stage,), micro_batch_size=mbs, num_micro_batches=m)

    plan = Plan(
        global_batch=8,
        seq_len=16,
        model=PRESETS["tiny-gpt"],
        cluster=emulated_cluster(),
        pipelines=(one_stage(0, 2, 3), one_stage(1, 2, 1)),
    ).validate_plan()
    plan.save(tmp_path / "plan.json")
    metrics = tmp_path / "m.jsonl"
    args = (
        f"train --plan {tmp_path / 'plan.json'} --steps 3 --emulate --verify "
        f"--metrics {metrics} --timeout-s 30"
    )
    cmd = [sys.executable, "-m", "hetpp.cli.main", *args.split()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "emulating device slowdowns 0: x1, 1: x3" in out.stdout
    assert "verify: " in out.stdout and out.stdout.split("verify: ")[1].split("\n")[0].endswith(
        "OK"
    )
    records = load_metrics(metrics)
    assert [r.step for r in records] == [1, 2, 3]
    summary = summarize(records)
    assert summary["steps"] == 3 and len(summary["compute_s"]) == 2
    assert summary["samples_per_s"] > 0


def _damaged_checkpoint(tmp_path) -> tuple[list[str], object]:
    """A 3-stage plan of tiny-gpt and a checkpoint whose layer-3 file is damaged; the train
    command that resumes from it."""
    c = PRESETS["tiny-gpt"]
    full = StageModule(c, 0, 6, seed=0, dtype=torch.float32)
    opts = TrainOptions(plan="unused")
    meta = checkpoint.CheckpointMeta(
        step=1, samples=4, seed=0, optimizer="adamw", model=c.model_dump(mode="json")
    )
    ckpt = tmp_path / "ckpt"
    checkpoint.save(
        ckpt,
        meta,
        full,
        make_optimizer(full.parameters(), opts),
        list(range(6)),
        rank=0,
        barrier=lambda: None,
    )
    (checkpoint.latest(ckpt) / "layer_0003.pt").write_bytes(b"damaged")
    stages = (
        StagePlan(devices=(0,), layers=(0, 2)),
        StagePlan(devices=(1,), layers=(2, 4)),
        StagePlan(devices=(2,), layers=(4, 6)),
    )
    pipe = PipelinePlan(stages=stages, micro_batch_size=1, num_micro_batches=4)
    Plan(global_batch=4, seq_len=16, precision="fp32", model=c, pipelines=(pipe,)).save(
        tmp_path / "plan.json"
    )
    args = (
        f"train --plan {tmp_path / 'plan.json'} --steps 3 --checkpoint-dir {ckpt} --resume "
        "--timeout-s 600"
    )
    return [sys.executable, "-m", "hetpp.cli.main", *args.split()], checkpoint.latest(ckpt)


def test_a_damaged_checkpoint_is_one_line_from_the_launcher(tmp_path):
    cmd, _ = _damaged_checkpoint(tmp_path)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "layer_0003.pt: checksum does not match meta.json" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "hetpp rank" not in out.stderr


def test_hetpp_train_stops_every_rank_when_one_fails(tmp_path):
    # A format-1 checkpoint (no checksums the launcher could check) whose layer-3 file is
    # damaged: only the rank holding layer 3 fails to load it; the others must notice, stop, and
    # the launcher must exit non-zero.
    cmd, saved = _damaged_checkpoint(tmp_path)
    meta = json.loads((saved / "meta.json").read_text())
    meta.update(format=1, files={})
    (saved / "meta.json").write_text(json.dumps(meta))
    # The others notice the lost peer at once: waiting for the 600 s collective timeout would
    # overrun the subprocess timeout and fail the test.
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode in (1, 2), out.stdout + out.stderr
    assert "hetpp rank 1: failed while loading the checkpoint: " in out.stderr
    assert "layer_0003.pt: unreadable layer file" in out.stderr
    assert "hetpp train: failed (exit codes rank 0: 1, rank 1: 2, rank 2: 1)" in out.stderr
    for r in (0, 2):
        assert f"hetpp rank {r}: failed while step 2: pipeline schedule" in out.stderr, out.stderr
