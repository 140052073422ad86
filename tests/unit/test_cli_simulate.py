"""`hetpp simulate`: JSON for machines, tables for people, a Gantt chart on request."""

import json

import simcases

from hetpp.cli.main import main


def _files(tmp_path, **train_updates):
    plan = simcases.plan([([(0, (0, 6))], 4), ([(2, (0, 3)), (3, (3, 6))], 4)])
    train = plan.train.model_copy(update=train_updates)
    plan.model_copy(update={"train": train}).save(tmp_path / "plan.json")
    simcases.profiles().save(tmp_path / "prof.csv")
    return str(tmp_path / "plan.json"), str(tmp_path / "prof.csv")


def test_json_has_the_promised_keys_and_writes_the_gantt(tmp_path, capsys):
    plan, prof = _files(tmp_path)
    png = tmp_path / "g.png"
    assert main(["simulate", plan, "--profile", prof, "--json", "--gantt", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    # pipeline 1 (two Slow stages, 0.60 s) is the slower one
    assert abs(out["pipeline_time_s"][1] - 0.60) < 1e-6
    assert out["iteration_time_s"] > 0.60 and 0 < out["bubble_fraction"] < 1
    assert out["exposed_sync_s"] >= 0
    assert abs(out["closed_form_iteration_time_s"] / out["iteration_time_s"] - 1) < 1e-6
    dev = out["devices"][0]
    assert {"device", "busy_fraction", "peak_memory_bytes", "memory_capacity_bytes"} <= set(dev)
    assert [d["device"] for d in out["devices"]] == [0, 2, 3]
    assert png.stat().st_size > 10_000


def test_tables_flag_devices_over_memory(tmp_path, capsys):
    plan, prof = _files(tmp_path, reserve_gb=2.0)  # more than the 1 GB these GPUs have
    assert main(["simulate", plan, "--profile", prof]) == 0
    out = capsys.readouterr().out
    assert "OVER" in out and "memory exceeded on device(s) 0, 2, 3" in out
    assert "cost model's closed form" in out


def test_missing_plan_is_a_clean_error(tmp_path, capsys):
    assert main(["simulate", str(tmp_path / "nope.json")]) == 2
    assert "file not found" in capsys.readouterr().err
