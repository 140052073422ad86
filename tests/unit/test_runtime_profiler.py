"""`hetpp profile` on the CPU: the runtime's own layers, a loadable profile table."""

from __future__ import annotations

import torch

from hetpp.cli.main import main
from hetpp.profile.table import ProfileTable
from hetpp.runtime.profiler import profile_layer
from hetpp.specs import PRESETS


def test_profile_writes_a_table_the_planner_reads(tmp_path):
    out = tmp_path / "cpu.csv"
    argv = [
        "profile",
        "--model",
        "tiny-llama",
        "--device",
        "cpu",
        "--micro-batch-sizes",
        "1,2",
        "--seq-len",
        "16",
        "--repeats",
        "1",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    table = ProfileTable.load(out)
    assert [(r.layer, r.mbs) for r in table.rows] == [
        (k, m) for k in ("embedding", "block", "head") for m in (1, 2)
    ]
    assert all(r.gpu == "CPU" and r.model == "tiny-llama" and r.seq_len == 16 for r in table.rows)
    assert all(r.fwd_s > 0 and r.bwd_s > 0 for r in table.rows)
    fwd, _, act = table.lookup("CPU", "block", 2)
    assert fwd > 0 and act > 0


def test_kept_bytes_are_what_autograd_saves():
    c = PRESETS["tiny-gpt"]
    one = profile_layer(c, "block", 1, 16, torch.device("cpu"), torch.float32, warmup=0, repeats=1)
    two = profile_layer(c, "block", 2, 16, torch.device("cpu"), torch.float32, warmup=0, repeats=1)
    assert two[2] == 2 * one[2]  # activations scale with the micro-batch; weights are not counted
    emb = profile_layer(c, "embedding", 2, 16, torch.device("cpu"), torch.float32, 0, 1)
    assert emb[2] == 2 * 16 * 8 + 16 * 8  # int64 token ids and the int64 learned positions


def test_a_cold_profile_evicts_the_caches_before_every_timed_call(monkeypatch):
    from hetpp.runtime import profiler

    evictions: list[bool] = []
    monkeypatch.setattr(profiler, "_evict", lambda buffer: evictions.append(buffer is not None))
    c, cpu = PRESETS["tiny-gpt"], torch.device("cpu")
    profile_layer(c, "block", 1, 16, cpu, torch.float32, warmup=1, repeats=2, cold=True)
    assert evictions == [True] * 6  # before each forward and each backward, warm-up included
    evictions.clear()
    profile_layer(c, "block", 1, 16, cpu, torch.float32, warmup=1, repeats=2)
    assert evictions == [False] * 6
