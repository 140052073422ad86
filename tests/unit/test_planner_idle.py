"""GPipe pipelines on the devices a plan leaves idle (`planner.idle`): on a hand-made cluster
whose small GPUs hold the model only three deep, where 1F1B's three micro-batches take longer
than the step, hpp's plan runs one micro-batch through them under GPipe and gets faster."""

from __future__ import annotations

from planner_cases import cluster, problem, small_model

from hetpp.planner import Problem, plan, search, sharding, unused_devices
from hetpp.planner.assemble import evaluate
from hetpp.planner.idle import with_idle_pipelines
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
    # without the pass the search leaves those devices idle, and its step is longer
    for module in (search, sharding):
        monkeypatch.setattr(module, "with_idle_pipelines", lambda problem, plan, step: (plan, step))
    without = plan(_problem(), "hpp")
    assert set(idle[0].devices) <= set(unused_devices(prob, without.plan))
    # 4.5% with the gradient norm's all-reduce before every optimizer step (5% before it)
    assert got.iteration_time_s < 0.99 * without.iteration_time_s


def test_pass_keeps_a_plan_it_cannot_improve():
    prob = _problem()
    got = plan(prob, "hpp")
    again = with_idle_pipelines(prob, got.plan, got.step)
    assert again[1] is got.step  # a plan with an idle pipeline already is left alone
