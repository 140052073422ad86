"""The planner's schedule pass: multi-chunk schedules per pipeline, judged by the full cost."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from planner_cases import cluster, problem, small_model
from test_planner_strategies import check_plan

from hetpp.cost.step import step_cost
from hetpp.planner import STRATEGIES, halves, idle, plan
from hetpp.planner.assemble import evaluate
from hetpp.planner.schedules import (
    TIE_REL,
    _beats,
    _kept_counts_bounds,
    _settle,
    choose_schedules,
    pass_bound_s,
)
from hetpp.sim import compare_with_cost
from hetpp.specs import SpecError, load_cluster
from hetpp.specs.plan import PipelinePlan, StagePlan
from hetpp.specs.schedule import SCHEDULES

CHUNKED = tuple(n for n, s in SCHEDULES.items() if s.placement != "one")
MULTI = tuple(n for n, s in SCHEDULES.items() if s.multi_stage)
MIXED8 = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "mixed-8.yaml"


@pytest.fixture(scope="module")
def plans():
    """hpp on 4 A100s + 4 RTX 4090s, gpt3-1.3b, batch 64: one-chunk only, and with every
    multi-chunk schedule allowed."""
    cl = load_cluster(MIXED8)
    # whole blocks (`half_blocks`): the pass is tested on the plans it gets, block-unit ones
    one = plan(problem(cl, "gpt3-1.3b", 64, seq=2048, schedules=(), half_blocks=False), "hpp")
    many = problem(cl, "gpt3-1.3b", 64, seq=2048, schedules=CHUNKED, half_blocks=False)
    return one, many, plan(many, "hpp")


def test_multi_chunk_plans_are_valid_fit_and_faster(plans):
    one, prob, got = plans
    check_plan(prob, got)
    final = got.final_plan()
    assert any(p.chunks > 1 for p in final.pipelines)  # the bubble is worth removing here
    assert {p.schedule for p in final.pipelines if p.chunks > 1} <= set(CHUNKED)
    assert got.iteration_time_s < one.iteration_time_s
    # the simulator agrees with the closed form the pass ranked it by
    assert abs(compare_with_cost(final, prob.cost_model(final.train.recompute)).rel_diff) < 0.05


def test_the_pass_never_makes_a_plan_slower_and_is_a_no_op_without_schedules(plans):
    one, prob, _ = plans
    base = one.final_plan()
    same, step = choose_schedules(problem(prob.cluster, prob.model, 64, schedules=()), base)
    assert same is base and step.iteration_time_s == pytest.approx(one.iteration_time_s)
    for split, rebalance in (("equal", False), ("balanced", False), ("equal", True)):
        _, step = choose_schedules(prob, base, split, rebalance)
        assert step.fits and step.iteration_time_s <= one.iteration_time_s * (1 + 1e-12)


@pytest.mark.parametrize("name", [n for n in STRATEGIES if n != "oracle"])
def test_every_strategy_may_use_them(name):
    cl = cluster(("A100-80GB", 4, 1), ("RTX-4090", 4, 1))
    p = problem(cl, "gpt3-1.3b", 32, schedules=CHUNKED)
    r = plan(p, name)
    check_plan(p, r)
    base = plan(problem(cl, "gpt3-1.3b", 32, schedules=()), name)
    assert r.iteration_time_s <= base.iteration_time_s * (1 + 1e-12)
    assert evaluate(p, r.plan).fits


def test_the_search_keeps_a_one_chunk_base_schedule():
    cl = cluster(("A100-80GB", 2, 1))
    with pytest.raises(SpecError, match="schedule: the planner shapes pipelines under a one-chunk"):
        _with_base("zbv", cl)
    with pytest.raises(SpecError, match="schedule: the planner shapes pipelines under a one-chunk"):
        _with_base("zbh1", cl)
    with pytest.raises(SpecError, match="schedules: '1f1b' is not a per-pipeline schedule"):
        problem(cl, "gpt3-1.3b", 8, schedules=("1f1b",))
    # by default only what the runtime executes
    expect = tuple(n for n in MULTI if SCHEDULES[n].executable)
    assert problem(cl, "gpt3-1.3b", 8).chunked_schedules == expect


def _with_base(schedule: str, cl):
    from hetpp.planner import Problem
    from hetpp.specs import TrainSpec, load_model

    return Problem(load_model("gpt3-1.3b", 1024), cl, TrainSpec(global_batch=8, schedule=schedule))


def test_loop_chunks_keep_each_device_s_layer_count():
    """Stages of 1, 3, 3 and 5 layers at 2 chunks: the first device (one layer) takes one
    from the fourth (the most), then each device's layers are dealt over its two chunks, the
    first chunk taking the odd one: 1+1, 2+1, 2+1, 2+2."""
    stages = tuple(
        StagePlan(devices=(d,), layers=ab) for d, ab in enumerate([(0, 1), (1, 4), (4, 7), (7, 12)])
    )
    pipe = PipelinePlan(stages=stages, micro_batch_size=1, num_micro_batches=8)
    got = _kept_counts_bounds(pipe, SCHEDULES["interleaved-1f1b"], 2)
    assert got == (0, 1, 3, 5, 7, 8, 9, 10, 12)
    # at 3 chunks the first device takes two (from the fourth, then the fourth again): 3 each
    assert _kept_counts_bounds(pipe, SCHEDULES["interleaved-1f1b"], 3) == tuple(range(13))
    assert _kept_counts_bounds(pipe, SCHEDULES["zbv"], 2) is None  # V: the head moves
    assert _kept_counts_bounds(pipe, SCHEDULES["interleaved-1f1b"], 4) is None  # 12 < 16


def test_the_pass_bound_is_optimistic(plans):
    one, prob, _ = plans
    bound = pass_bound_s(one.plan, one.step)
    assert bound < one.iteration_time_s
    assert bound <= choose_schedules(prob, one.plan)[1].iteration_time_s
    # (the search's own plan may come from another layout, the chunk-aware count DP's: this
    # layout's bound does not hold for it)


def test_a_plan_recomputing_on_no_stage_is_tried_as_one_without_recomputation(plans):
    # edu-32 gpt3-13b: ZeRO-1 let every stage drop recomputation, yet the plan-wide flag made
    # every stage of each chunked trial recompute and kept the split-backward schedules out
    one, prob, _ = plans
    base = one.final_plan()
    assert not base.train.recompute
    off = tuple(
        p.model_copy(update={"stages": tuple(
            st.model_copy(update={"recompute": False}) for st in p.stages)})
        for p in base.pipelines
    )  # fmt: skip
    train = base.train.model_copy(update={"recompute": True})
    flagged = base.model_copy(update={"train": train, "pipelines": off})
    assert step_cost(flagged, prob.cost_model(True)) == step_cost(base, prob.cost_model(False))
    _, want = choose_schedules(prob, base)
    got_plan, got = choose_schedules(prob, flagged)
    assert want.iteration_time_s < one.iteration_time_s  # the pass wins here
    assert got == want
    assert not any(st.recomputes(got_plan.train) for p in got_plan.pipelines for st in p.stages)
    assert got_plan.train.recompute  # still says how it was searched; the same cost
    assert step_cost(got_plan, prob.cost_model(True)) == got


def test_a_trial_recomputes_only_on_the_devices_it_overfills():
    # mixed-8 gpt3-13b: the one-chunk plan's interleaved trial overfills three RTX 4090s by
    # their activations; searched with recomputation, it recomputes there and nowhere else
    from hetpp.cost.step import device_memories
    from hetpp.planner.schedules import _costed, group_trials, pass_start

    p = problem(
        load_cluster(MIXED8), "gpt3-13b", 64, seq=2048, schedules=("interleaved-1f1b",),
        half_blocks=False,
    )  # fmt: skip
    one = plan(p, "hpp").plan
    assert len(one.pipelines) == 1 and one.pipelines[0].chunks == 1
    flagged = one.model_copy(update={"train": one.train.model_copy(update={"recompute": True})})
    start = pass_start(flagged)
    assert not start.train.recompute and start.pipelines[0].stages[0].recompute is True
    one = one.model_copy(update={"train": start.train})  # the trial's stages as searched
    trial = next(t for *_, thin, t in group_trials(p, one, [0], ("interleaved-1f1b",), "balanced")
                 if not thin)  # fmt: skip
    over = {
        d for d, (m, cap) in device_memories(evaluate(p, trial).stages).items() if m.total > cap
    }
    assert over and len(over) < len(trial.pipelines[0].devices)
    same, cost = _costed(p, trial, float("inf"), may_recompute=False)
    assert same is trial and cost is None  # refused: it does not fit
    got, cost = _costed(p, trial, float("inf"), may_recompute=True)
    assert cost.fits and cost == evaluate(p, got)
    assert [st.device in over for st in got.pipelines[0].stages] == [
        bool(st.recompute) for st in got.pipelines[0].stages
    ]


def test_a_trial_leaves_out_the_devices_a_second_chunk_would_slow():
    # 2 T4s in front of 4 H100s, gpt3-2.7b: the one-chunk split gives each T4 one layer (the
    # embedding, a block); at 2 chunks each would need a second, so every trial on all six
    # devices loses to 1F1B. Without the T4s, the H100s under ZB-V are 22% faster.
    cl = cluster(("T4", 2, 1), ("H100-80GB", 2, 2))
    base = plan(problem(cl, "gpt3-2.7b", 32, schedules=()), "layer-balanced")
    (pipe,) = base.plan.pipelines
    thin = [st.device for st in pipe.stages if st.layers[1] - st.layers[0] < 2]
    assert {cl.gpu(d).name for d in thin} == {"T4"}
    p = problem(cl, "gpt3-2.7b", 32, schedules=CHUNKED)
    got, step = choose_schedules(p, base.plan)
    assert step.fits and step.iteration_time_s < 0.8 * base.iteration_time_s
    assert step == step_cost(got, p.cost_model(got.train.recompute))
    (moved,) = got.pipelines
    assert moved.chunks == 2 and not set(thin) & set(moved.devices)


def test_the_pass_gives_a_one_chunk_pipeline_zbh1_where_a_second_chunk_doubles_a_slow_layer(
    monkeypatch,
):
    # llama2-7b on 2 T4 + 2 L4 + 2 A100-40GB + 2 H100 (cloud-64's pipeline): each T4 holds one
    # layer, so every 2-chunk trial doubles its work. ZB-H1 keeps the cuts, and its deferred
    # weight-grads fill 1F1B's drain. Compared without the join of unused devices
    # (`idle.joined_if_faster`), which runs on the winner of the pass only: with it, the search
    # without zbh1 appends the two L4s to its 4-device DualPipeV plan at half blocks (1.1014 s)
    # and beats the search with zbh1 (1.1590 s, the zbh1 plan with a T4 appended).
    for module in (idle, halves):
        monkeypatch.setattr(module, "joined_if_faster", lambda problem, plan, step: (plan, step))
    cl = cluster(("T4", 2, 1), ("L4", 2, 1), ("A100-40GB", 2, 1), ("H100-80GB", 2, 1))
    others = tuple(n for n in problem(cl, "llama2-7b", 32).chunked_schedules if n != "zbh1")
    with_it = problem(cl, "llama2-7b", 32)
    got, without = plan(with_it, "hpp"), plan(problem(cl, "llama2-7b", 32, schedules=others), "hpp")
    check_plan(with_it, got)
    final = got.final_plan()
    assert [p.schedule for p in final.pipelines] == ["zbh1"]
    assert got.iteration_time_s < without.iteration_time_s * (1 - 1e-3)
    cm = with_it.on_unit(final.model.layer_unit).cost_model(final.train.recompute)
    assert abs(compare_with_cost(final, cm).rel_diff) < 0.05


def test_settling_a_plan_of_mixed_micro_batch_sizes_keeps_its_samples():
    """Two one-stage pipelines at micro-batch sizes 2 and 3 (12 samples): counts that add up
    to the batch are taken as they are, others refused. Handing out micro-batches of the first
    pipeline's size made a targeted pass's plan train 768 of slowlink-256's 1024 samples."""
    p = problem(cluster(("A100-80GB", 1, 2)), small_model(4, 512), 12, half_blocks=False)
    base = plan(p, "hpp").plan
    pipes = tuple(
        PipelinePlan(
            stages=(StagePlan(devices=(d,), layers=(0, p.layer_list_len)),),
            micro_batch_size=mbs,
            num_micro_batches=m,
        )
        for d, mbs, m in ((0, 2, 3), (1, 3, 2))
    )
    mixed = base.model_copy(update={"pipelines": pipes, "grad_blocks": None})
    got = _settle(p, mixed, [3, 2])
    assert [q.num_micro_batches for q in got.pipelines] == [3, 2]
    assert _settle(p, mixed, [2, 2]) is None


def test_a_gain_at_float_rounding_is_a_tie_that_keeps_the_schedule():
    # On one device ZB-H1 is 1F1B with a split backward: the cost model prices both the same,
    # to the last ulp or two; the pass must keep the schedule it started from.
    def cost(t, fits=True):
        return SimpleNamespace(iteration_time_s=t, fits=fits)

    best = cost(0.5863651546228117)
    assert not _beats(cost(0.5863651546228116), best)
    assert not _beats(cost(best.iteration_time_s * (1 - TIE_REL / 2)), best)
    assert _beats(cost(best.iteration_time_s * (1 - 2 * TIE_REL)), best)
    assert not _beats(cost(0.1, fits=False), best) and not _beats(None, best)


def test_one_device_keeps_1f1b():
    # the case bench/gpu_check.sh plans: one H200, where ZB-H1 was picked at 1 ulp faster
    one = problem(cluster(("H200", 1, 1)), "gpt3-1.3b", 16, seq=2048, micro_batch_sizes=(4,))
    r = plan(one, "hpp")
    assert r.feasible and r.plan.pipelines[0].schedule is None
