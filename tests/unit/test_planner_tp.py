"""Tensor-parallel degree per GPU type: pools of groups, plans of TP stages, the degree search."""

from __future__ import annotations

import json

import pytest
from planner_cases import cluster, problem

from hetpp.cli.main import main
from hetpp.cost.step import step_cost
from hetpp.planner import plan
from hetpp.planner.tp import degree_options
from hetpp.specs import SpecError


def _mixed():
    # one node of 4 A100-80GB (NVLink-class), one of 4 V100-16GB
    return cluster(("A100-80GB", 4, 1), ("V100-16GB", 4, 1), inter=12.5)


def test_a_pool_of_tp_groups_places_whole_groups_and_plans_them():
    p = problem(_mixed(), "gpt3-2.7b", 16, seq=2048, tp_degrees={"a100-80gb": 2})
    assert p.pools["a100-80gb"].nodes == ((0, 2),) and p.pools["v100-16gb"].nodes == ((4, 5, 6, 7),)
    assert p.group_of(2) == (2, 3) and p.units == [0, 2, 4, 5, 6, 7]
    r = plan(p, "hpp")
    final = r.final_plan().validate_plan()
    stages = [s for pipe in final.pipelines for s in pipe.stages]
    a100 = [s for s in stages if s.device < 4]
    assert a100 and all(s.tp == 2 for s in a100) and all(s.tp == 1 for s in stages if s.device > 3)
    assert step_cost(final, p.cost_model(final.train.recompute)).iteration_time_s == (
        pytest.approx(r.iteration_time_s)
    )


def test_degrees_are_those_a_node_holds_and_the_heads_divide():
    p = problem(cluster(("A100-80GB", 8, 1), ("T4", 2, 1)), "llama3-8b", 8, seq=2048)
    assert degree_options(p) == {"a100-80gb": [1, 2, 4, 8], "t4": [1, 2]}
    # tiny-llama has 2 KV heads: no degree above 2
    assert degree_options(problem(cluster(("A100-80GB", 8, 1)), "tiny-llama", 8, seq=64)) == {
        "a100-80gb": [1, 2]
    }
    with pytest.raises(SpecError, match=r"expected 1\.\.4"):
        _ = problem(_mixed(), "gpt3-2.7b", 16, tp_degrees={"v100-16gb": 8}).pools


def test_the_tp_search_never_loses_and_wins_where_memory_is_short():
    # gpt3-6.7b does not fit on few V100-16GB without splitting: TP shares the blocks. TP
    # stages run one-chunk schedules only, so against one-chunk plans TP wins here ...
    off = problem(_mixed(), "gpt3-6.7b", 16, seq=2048, schedules=())
    on = problem(_mixed(), "gpt3-6.7b", 16, seq=2048, tp_search=True, schedules=())
    r_off, r_on = plan(off, "hpp"), plan(on, "hpp")
    assert r_on.iteration_time_s < r_off.iteration_time_s
    assert "TP degree per GPU type searched (all 9 assignments" in r_on.note
    final = r_on.final_plan().validate_plan()
    assert any(s.tp > 1 for pipe in final.pipelines for s in pipe.stages)
    print(f"gpt3-6.7b: {r_off.throughput_samples_per_s:.3f} -> {r_on.throughput_samples_per_s:.3f}")
    # ... and with multi-chunk schedules allowed, all-ones (no TP) keeps them: never slower
    chunked_off = plan(problem(_mixed(), "gpt3-6.7b", 16, seq=2048), "hpp")
    chunked_on = plan(problem(_mixed(), "gpt3-6.7b", 16, seq=2048, tp_search=True), "hpp")
    assert chunked_on.iteration_time_s <= chunked_off.iteration_time_s


def test_hetpp_plan_shows_the_tp_degree(tmp_path, capsys):
    cl = tmp_path / "c.yaml"
    cl.write_text(
        "nodes:\n  - {gpu: A100-80GB, gpus_per_node: 4, intra_node_GBps: 300}\n"
        "inter_node_GBps: 12.5\n"
    )
    out = tmp_path / "p.json"
    argv = ["plan", "--cluster", str(cl), "--model", "gpt3-6.7b", "--global-batch", "8"]
    # hpp on one-chunk schedules (a TP stage runs no multi-chunk one; here a V without TP wins)
    argv += ["--strategy", "hpp", "--try-schedules"]
    assert main([*argv, "--tp", "auto", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [c.strip() for c in lines[2].split("┃")][1:-1] == [
        *("pipes", "schedule", "stage", "GPU", "TP", "devices", "layers", "mbs x m", "batch"),
        "free mem",
    ]
    # two one-stage pipelines of TP 2: states of 6.7B parameters (121 GB) need two A100s
    assert [c.strip() for c in lines[4].split("│")][1:7] == [
        "2",
        "1f1b",
        "0",
        "A100-80GB",
        "2",
        "0-3",
    ]
    pipes = json.loads(out.read_text())["pipelines"]
    devices = [[s["devices"] for s in p["stages"]] for p in pipes]
    assert devices == [[[0, 1]], [[2, 3]]]


def test_one_type_at_a_time_reaches_the_exhaustive_choice_here(monkeypatch):
    import hetpp.planner.tp as tp

    p = problem(_mixed(), "gpt3-6.7b", 16, seq=2048, tp_search=True)
    every = plan(p, "hpp")
    monkeypatch.setattr(tp, "EXHAUSTIVE", 1)
    descent = plan(p, "hpp")
    assert "one type at a time over 9 assignments" in descent.note
    assert descent.iteration_time_s == pytest.approx(every.iteration_time_s)


def test_tp_is_not_planned_with_sharding():
    with pytest.raises(SpecError, match="not combined with optimizer sharding") as e:
        problem(_mixed(), "gpt3-2.7b", 16, tp_search=True, sharding_mode="auto")
    assert e.value.field == "sharding"
    # TP degrees leave no multi-chunk schedule to try (a TP group runs one stage)
    tp2 = problem(_mixed(), "gpt3-2.7b", 16, tp_degrees={"a100-80gb": 2})
    assert tp2.chunked_schedules == ()
    # nor an FSDP plan (it would run on the groups' lead devices alone)
    assert not plan(tp2, "fsdp").feasible
