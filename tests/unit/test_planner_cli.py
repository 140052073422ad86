"""`hetpp plan` and `hetpp compare`; the planner benchmark's quick mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetpp.cli.main import main
from hetpp.profile.table import ProfileRow, ProfileTable
from hetpp.specs import load_plan

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = """
name: two-types
nodes:
  - {gpu: A100-80GB, gpus_per_node: 2, intra_node_GBps: 300}
  - {gpu: RTX-4090, gpus_per_node: 2, intra_node_GBps: 32}
inter_node_GBps: 25
"""


def _cluster(tmp_path: Path) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    return str(path)


def test_plan_writes_a_self_contained_plan_and_prints_it(tmp_path, capsys):
    out = tmp_path / "plan.json"
    args = ["plan", "--cluster", _cluster(tmp_path), "--model", "gpt3-350m", "--strategy", "hpp"]
    assert main([*args, "--global-batch", "32", "--seq-len", "1024", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hpp plan: gpt3-350m" in text and "samples/s" in text and "search" in text
    plan = load_plan(out)
    assert plan.strategy == "hpp" and plan.model.name == "gpt3-350m"
    assert plan.cluster.name == "two-types" and plan.seq_len == 1024
    assert plan.grad_blocks and plan.estimate.iteration_time_s > 0


def test_default_plan_is_the_fastest_family(tmp_path, capsys):
    args = ["plan", "--cluster", _cluster(tmp_path), "--model", "gpt3-350m", "--global-batch"]
    args += ["32", "--seq-len", "1024", "--json", "--out", str(tmp_path / "p.json")]
    got = {}
    for strategy in ("best", "hpp", "fsdp"):
        assert main([*args, "--strategy", strategy]) == 0
        got[strategy] = json.loads(capsys.readouterr().out)
    assert main(args) == 0  # the default is best
    default = json.loads(capsys.readouterr().out)
    assert default["strategy"] == got["best"]["strategy"]
    fastest = max(got["hpp"], got["fsdp"], key=lambda e: e["throughput_samples_per_s"])
    assert default["strategy"] == fastest["strategy"]
    assert default["throughput_samples_per_s"] == pytest.approx(fastest["throughput_samples_per_s"])


def test_plan_json_baseline_strategy_and_options(tmp_path, capsys):
    out = tmp_path / "p.json"
    args = ["plan", "--cluster", _cluster(tmp_path), "--model", "gpt3-350m", "--global-batch"]
    args += ["24", "--seq-len", "1024", "--strategy", "data-balanced", "--micro-batch-sizes"]
    args += ["2,4", "--recompute", "on", "--schedule", "gpipe", "--json", "--out", str(out)]
    assert main(args) == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry["strategy"] == "data-balanced" and entry["feasible"]
    plan = entry["plan"]
    assert plan["train"]["recompute"] is True and plan["train"]["schedule"] == "gpipe"
    assert {p["micro_batch_size"] for p in plan["pipelines"]} <= {2, 4}
    assert entry["search_time_s"] >= 0 and isinstance(entry["unused_devices"], list)


def test_measured_profile_replaces_the_estimate(tmp_path, capsys):
    rows = [
        ProfileRow("A100-80GB", "gpt3-350m", 1024, kind, mbs, 0.1 * mbs, 0.2 * mbs, 10**6 * mbs)
        for kind in ("embedding", "block", "head")
        for mbs in (1, 2)
    ]
    prof = tmp_path / "a100.csv"
    ProfileTable(rows).save(prof)
    common = ["--cluster", _cluster(tmp_path), "--model", "gpt3-350m", "--global-batch", "8"]
    common += ["--seq-len", "1024", "--json", "--out", str(tmp_path / "x.json")]
    assert main(["plan", *common]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["plan", *common, "--profile", str(prof)]) == 0
    measured = json.loads(capsys.readouterr().out)
    # 26 layers x 0.3 s per sample on the A100s, far slower than their estimate: the plan
    # leans on the RTX-4090s and still takes longer.
    assert measured["iteration_time_s"] > 1.5 * plain["iteration_time_s"]


def test_infeasible_exits_2_with_the_reason(tmp_path, capsys):
    args = ["plan", "--cluster", _cluster(tmp_path), "--model", "llama2-13b"]
    assert main([*args, "--global-batch", "16", "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "llama2-13b needs at least 234 GB" in err and "4 devices have" in err
    args = ["compare", "--cluster", _cluster(tmp_path), "--model", "llama2-13b"]
    assert main([*args, "--global-batch", "16"]) == 2


def test_compare_json_and_plot(tmp_path, capsys):
    png = tmp_path / "cmp.png"
    args = ["compare", "--cluster", _cluster(tmp_path), "--model", "gpt3-1.3b"]
    assert main([*args, "--global-batch", "16", "--json", "--plot", str(png)]) == 0
    entries = json.loads(capsys.readouterr().out)
    names = [e["strategy"] for e in entries]
    assert sorted(names) == sorted(
        ["uniform", "layer-balanced", "data-balanced", "hpp", "fsdp", "oracle"]
    )
    for e in entries:
        assert {"strategy", "feasible", "iteration_time_s", "throughput_samples_per_s"} <= set(e)
        assert "search_time_s" in e and "plan" in e
        assert (e["plan"] is None) == (not e["feasible"])
    by = {e["strategy"]: e for e in entries}
    assert by["hpp"]["throughput_samples_per_s"] >= max(
        e["throughput_samples_per_s"]
        for e in entries
        if e["feasible"] and e["strategy"] not in ("oracle", "fsdp")
    )
    assert png.stat().st_size > 1000
    assert main([*args, "--global-batch", "16"]) == 0
    text = capsys.readouterr().out
    assert "hpp gain" in text and "layer-balanced" in text


def test_bench_quick_mode_runs(tmp_path):
    out = tmp_path / "bench.md"
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "planner.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert "hpp over the best baseline" in res.stdout
    text = out.read_text()
    assert "bench/planner.py --quick" in text and "| mixed-8 |" in text
    assert "## Where the step goes" in text


def test_plan_time_limit_keeps_the_best_plan_so_far_and_says_so(tmp_path, capsys):
    args = ["plan", "--cluster", _cluster(tmp_path), "--model", "gpt3-350m", "--global-batch"]
    args += ["32", "--seq-len", "1024", "--json", "--out", str(tmp_path / "p.json")]
    args += ["--strategy", "hpp"]
    assert main([*args, "--time-limit", "1e-9"]) == 0  # stops once the first plan is found
    cut = json.loads(capsys.readouterr().out)
    assert cut["feasible"] and cut["note"].startswith("time limit of 1e-09 s reached")
    assert main([*args, "--time-limit", "1000"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert "time limit" not in full["note"]
    assert full["iteration_time_s"] <= cut["iteration_time_s"]
    assert main([*args[:-2], "--time-limit", "5", "--strategy", "uniform"]) == 2
    assert "hpp search only" in capsys.readouterr().err
    assert main([*args, "--time-limit", "0"]) == 2  # main returns argparse's exit code
    assert "--time-limit: expected a finite number > 0" in capsys.readouterr().err


def test_plan_sharding_option_and_its_line(tmp_path, capsys):
    # Two A100-40GB: gpt3-2.7b fits one only sharded over two copies (test_cost_sharding).
    path = tmp_path / "c.yaml"
    path.write_text("nodes:\n  - {gpu: A100-40GB, gpus_per_node: 2, intra_node_GBps: 100}\n"
                    "inter_node_GBps: 25\n")  # fmt: skip
    args = [
        "plan",
        "--cluster",
        str(path),
        "--model",
        "gpt3-2.7b",
        "--global-batch",
        "8",
        "--strategy",
        "hpp",
        "--try-schedules",  # none: one-chunk 1F1B, whose bubble the sharded copies avoid
    ]
    for mode, want in (("none", "none"), ("auto", "optimizer")):
        out = tmp_path / f"{mode}.json"
        assert main([*args, "--seq-len", "1024", "--sharding", mode, "--out", str(out)]) == 0
        assert load_plan(out).sharding == want
        text = capsys.readouterr().out
        assert ("optimizer sharding: each bucket's optimizer state split over its 2" in text) == (
            want == "optimizer"
        )


def test_plan_tries_multi_chunk_schedules_when_asked(tmp_path, capsys):
    args = ["plan", "--cluster", _cluster(tmp_path), "--model", "gpt3-1.3b", "--seq-len", "1024"]
    out = tmp_path / "plan.json"
    chunked = ["interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev"]
    assert (
        main([*args, "--global-batch", "32", "--try-schedules", *chunked, "--out", str(out)]) == 0
    )
    plan = load_plan(out)
    shown = capsys.readouterr().out
    assert "schedule" in shown
    for pipe in plan.pipelines:
        name = pipe.schedule_in(plan.train).name
        assert name in shown and (pipe.chunks > 1) == (name in chunked)
    # the search itself runs a one-chunk schedule
    assert main([*args, "--global-batch", "32", "--schedule", "zbv"]) == 2


def test_plan_falls_back_to_sharding_only_when_nothing_fits_and_says_so(tmp_path, capsys):
    # Issue 14's case: Llama-3.1-70B on 16 A100-80GB + 16 V100-32GB fits no whole replicas.
    args = ["plan", "--cluster", str(ROOT / "examples/a100-v100.yaml"), "--model"]
    args += [str(ROOT / "examples/models/llama-3.1-70b.json"), "--seq-len", "4096"]
    args += ["--global-batch", "64", "--out", str(tmp_path / "p.json")]
    assert main([*args, "--sharding", "none"]) == 2
    assert "no plan fits" in capsys.readouterr().err
    assert main(args) == 0
    assert "comes from --sharding auto" in capsys.readouterr().err
    plan = load_plan(tmp_path / "p.json")
    # what made it fit: half-precision parameters with fp32 masters in the optimizer (10 B a
    # parameter), with ZeRO-1 over the pipelines where there are several (one 32-stage
    # pipeline since the chunk-aware search: nothing to shard over)
    assert plan.train.master_weights == "optimizer"
    assert plan.sharding == "optimizer" or len(plan.pipelines) == 1
    # a plan that fits unsharded is not touched, and nothing is said
    small = ["plan", "--cluster", _cluster(tmp_path), "--model", "gpt3-1.3b", "--seq-len", "1024"]
    assert main([*small, "--global-batch", "16", "--out", str(tmp_path / "q.json")]) == 0
    assert "--sharding auto" not in capsys.readouterr().err
    assert load_plan(tmp_path / "q.json").sharding != "optimizer"  # FSDP ("full") may win


def test_plan_ends_stages_mid_block_unless_told_whole_blocks(tmp_path, capsys):
    # gpt3-1.3b over 2 A100s and 2 RTX 4090s: the default plan ends a stage between a block's
    # attention and MLP halves (3.8% faster here); --whole-blocks keeps every cut at a block
    args = ["plan", "--cluster", _cluster(tmp_path), "--model", "gpt3-1.3b", "--seq-len", "1024"]
    args += ["--global-batch", "16"]
    plans = {}
    for flag in ((), ("--whole-blocks",)):
        out = tmp_path / f"plan{len(flag)}.json"
        assert main([*args, *flag, "--out", str(out)]) == 0
        plans[flag] = (load_plan(out), capsys.readouterr().out)
    (half, text), (whole, whole_text) = plans[()], plans[("--whole-blocks",)]
    assert half.model.layer_unit == "half" and "layers count half" in text
    assert any(st.layers[1] % 2 == 0 for p in half.pipelines for st in p.stages[:-1])
    assert whole.model.layer_unit == "block" and "half blocks" not in whole_text
    assert half.estimate.iteration_time_s < 0.995 * whole.estimate.iteration_time_s
    assert main(["simulate", str(tmp_path / "plan0.json")]) == 0  # the simulator reads it
    assert "+0.00% vs simulated" in capsys.readouterr().out
