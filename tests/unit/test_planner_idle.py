"""The devices a plan leaves idle (`planner.idle`): on a hand-made cluster whose small GPUs hold
the model only three deep, where 1F1B's three micro-batches take longer than the step, hpp's
plan runs one micro-batch through them under GPipe and gets faster; where small GPUs hold no
pipeline of their own but a stage of each V pipeline, they join the plan's pipelines."""

from __future__ import annotations

from planner_cases import cluster, problem, small_model

from hetpp.planner import Problem, halves, idle, plan, search, sharding, unused_devices
from hetpp.planner.assemble import evaluate
from hetpp.planner.halves import in_halves
from hetpp.planner.idle import joined_if_faster, with_idle_pipelines
from hetpp.planner.placement import take_runs
from hetpp.specs import GpuType
from hetpp.specs.plan import Plan


def _problem() -> Problem:
    """One fast GPU and four slow ones (20x slower, 2.5 GB): a small GPU's whole-model time
    per sample is most of the step, and the model's states fill three of them."""
    types = [
        GpuType(name="big", bf16_tflops=400.0, memory_gb=80.0, mem_bw_GBps=3000.0),
        GpuType(name="small", bf16_tflops=20.0, memory_gb=2.5, mem_bw_GBps=300.0),
    ]
    cl = cluster(("big", 1, 1), ("small", 4, 1), inter=400.0, gpu_types=types)
    # One-chunk pipelines under the TrainSpec's 1F1B only: zbh1 over one small and the big GPU
    # (0.0304 s) beats what GPipe on the idle ones adds, and this case is about those.
    return problem(cl, small_model(4, 1024), 8, micro_batch_sizes=(1,), schedules=())


def test_idle_devices_run_a_gpipe_pipeline(monkeypatch):
    prob = _problem()
    got = plan(prob, "hpp")
    idle = [p for p in got.plan.pipelines if p.schedule == "gpipe"]
    assert len(idle) == 1
    # fewer micro-batches than stages: what 1F1B refuses and GPipe takes
    assert idle[0].num_micro_batches < len(idle[0].stages)
    assert {prob.cluster.gpu(d).name for d in idle[0].devices} == {"small"}
    assert sum(p.batch for p in got.plan.pipelines) == 8
    assert got.step.fits
    Plan.model_validate(got.plan.model_dump()).validate_plan(prob.cluster)  # torch's rules too
    assert evaluate(_problem(), got.plan).iteration_time_s == got.iteration_time_s
    # without the pass (nor the join of the half-block pass) the search leaves those devices
    # idle, and its step is longer
    for module in (search, sharding):
        monkeypatch.setattr(module, "with_idle_pipelines", lambda problem, plan, step: (plan, step))
    monkeypatch.setattr(halves, "joined_if_faster", lambda problem, plan, step: (plan, step))
    without = plan(_problem(), "hpp")
    assert set(idle[0].devices) <= set(unused_devices(prob, without.plan))
    # 4.5% with the gradient norm's all-reduce before every optimizer step (5% before it)
    assert got.iteration_time_s < 0.99 * without.iteration_time_s


def test_pass_keeps_a_plan_it_cannot_improve():
    prob = _problem()
    got = plan(prob, "hpp")
    again = with_idle_pipelines(prob, got.plan, got.step)
    assert again[1] is got.step  # a plan with an idle pipeline already is left alone


def _join_problem() -> Problem:
    """4 H100s and 8 T4s (16 GB), llama2-7b at 2048 tokens: no T4 pipeline fits beside the
    H100s' step, but a T4 holding one block's two halves takes less than an H100's stages of a
    two-pipeline V plan (the shape of gen-32 llama2-7b in `bench/planner.py`)."""
    cl = cluster(("H100-80GB", 4, 1), ("T4", 8, 1))
    return problem(cl, "llama2-7b", 32, seq=2048, sharding_mode="targeted")


def test_unused_devices_join_the_v_pipelines_as_extra_stages(monkeypatch):
    prob = _join_problem()
    got = plan(prob, "hpp")
    assert unused_devices(prob, got.plan) == []
    assert got.step.fits
    Plan.model_validate(got.plan.model_dump()).validate_plan(prob.cluster)  # torch's rules too
    for pipe in got.plan.pipelines:
        assert pipe.schedule_in(got.plan.train).placement == "v"
        assert {prob.cluster.gpu(d).name for d in pipe.devices} == {"H100-80GB", "T4"}
    assert got.plan.model.layer_unit == "half"  # a T4 of a V pipeline holds half a block twice
    # without the join the search leaves six T4s idle, and its step is longer
    for module in (idle, halves):
        monkeypatch.setattr(module, "joined_if_faster", lambda problem, plan, step: (plan, step))
    without = plan(_join_problem(), "hpp")
    assert len(unused_devices(prob, without.plan)) == 6
    assert got.iteration_time_s < 0.95 * without.iteration_time_s  # 1.502 against 1.647 s


def test_join_appends_the_devices_at_the_v_turn_and_keeps_the_batch(monkeypatch):
    prob = _join_problem()
    for module in (idle, halves):
        monkeypatch.setattr(module, "joined_if_faster", lambda problem, plan, step: (plan, step))
    without = plan(prob, "hpp")
    monkeypatch.undo()
    costed = sharding.sharded_problem(prob) if without.plan.sharding == "optimizer" else prob
    start = without.plan if without.plan.model.layer_unit == "half" else in_halves(without.plan)
    costed = costed.on_unit("half")
    step = evaluate(costed, start)
    got, cost = joined_if_faster(costed, start, step)
    assert cost.fits and cost.iteration_time_s < step.iteration_time_s
    assert evaluate(costed, got).iteration_time_s == cost.iteration_time_s
    free = set(unused_devices(prob, start))
    for old, new in zip(start.pipelines, got.pipelines):
        k = len(new.devices) - len(old.devices)
        assert k > 0 and new.devices[: len(old.devices)] == old.devices  # after the last device
        assert set(new.devices[-k:]) <= free
    assert sum(p.batch for p in got.pipelines) == prob.global_batch
    # nothing left to join: the plan comes back as it was
    assert unused_devices(prob, got) == []
    again = joined_if_faster(costed, got, cost)
    assert again[0] is got and again[1] is cost


def test_take_runs_fills_one_node_before_splitting_a_run():
    nodes = ((0, 1, 2, 3), (4, 5, 6, 7))
    assert take_runs(nodes, {1, 2, 4, 5, 6, 7}, [2, 2]) == [[1, 2], [4, 5]]  # best fit first
    # then over the nodes with the most free devices
    assert take_runs(nodes, {1, 2, 4, 5, 6, 7}, [3, 3]) == [[4, 5, 6], [1, 2, 7]]
    assert take_runs(nodes, {1, 2}, [2, 1]) is None
