"""`planner.halves`: a plan moved to the half-block layer list costs what it did, and the stage
DP and climb there can end a stage mid-block where whole blocks leave a fast and slow pair
unbalanced; the default search ends with that pass (`Problem.half_blocks`)."""

from pathlib import Path

import pytest

from hetpp.planner import halves
from hetpp.planner import plan as run_planner
from hetpp.planner.assemble import evaluate
from hetpp.planner.halves import can_halve, halves_if_faster, in_halves, with_half_blocks
from hetpp.planner.sharding import sharded_problem
from hetpp.specs import load_cluster
from tests.unit.planner_cases import cluster, problem


def _problem(half_blocks: bool = False):
    # gpt3-1.3b over 2 A100s and 2 RTX 4090s in one pipeline (`halves_if_faster` finds a
    # 2.1% shorter step)
    cl = cluster(("A100-80GB", 2, 1), ("RTX-4090", 2, 1))
    return problem(cl, "gpt3-1.3b", 16, sharding_mode="targeted", half_blocks=half_blocks)


def _costing_problem(p, plan):
    """The problem a plan of the search was costed with (sharded plans: `sharded_problem`)."""
    return sharded_problem(p) if plan.sharding == "optimizer" else p


@pytest.mark.parametrize("model", ["gpt3-350m", "llama2-7b"])
def test_a_plan_on_half_blocks_with_its_cuts_costs_the_same(model):
    cl = cluster(("A100-80GB", 4, 1), ("RTX-4090", 4, 1))
    p = problem(cl, model, 32, seq=512, sharding_mode="targeted", half_blocks=False)
    got = run_planner(p)
    base = _costing_problem(p, got.plan)
    moved = in_halves(got.plan)
    moved.validate_plan(cl)
    assert moved.model.layer_unit == "half" and can_halve(got.plan)
    assert [st.layers[1] % 2 for pipe in moved.pipelines for st in pipe.stages[:-1]] == [1] * (
        sum(len(pipe.stages) - 1 for pipe in moved.pipelines)
    )  # every cut at a block's start (its attention half)
    again = evaluate(base, moved)  # costed on the plan's unit
    # the same layer costs in halves: prefix sums over twice the entries round differently
    assert again.iteration_time_s == pytest.approx(got.iteration_time_s, rel=1e-12)
    assert again.pipeline_time_s == pytest.approx(got.step.pipeline_time_s, rel=1e-12)


def test_halves_end_a_stage_mid_block_where_that_is_faster():
    p = _problem()
    got = run_planner(p)
    base = _costing_problem(p, got.plan)
    plan, step = halves_if_faster(base, got.plan, got.step)
    assert step.iteration_time_s < 0.99 * got.iteration_time_s
    plan.validate_plan(p.cluster)
    cuts = [st.layers[1] for pipe in plan.pipelines for st in pipe.stages[:-1]]
    assert any(c % 2 == 0 for c in cuts)  # a stage ends after an attention half
    assert evaluate(base.on_unit("half"), plan).iteration_time_s == step.iteration_time_s


def test_the_search_ends_with_the_pass_and_says_nothing_else_changed():
    whole = run_planner(_problem(half_blocks=False))
    got = run_planner(_problem(half_blocks=True))
    assert whole.plan.model.layer_unit == "block"
    assert got.plan.model.layer_unit == "half"
    assert got.iteration_time_s < 0.99 * whole.iteration_time_s
    got.final_plan().validate_plan(_problem().cluster)
    # the pass on the block-unit search's plan is what the default search returns
    again = with_half_blocks(_problem(half_blocks=True), whole)
    assert again.plan == got.plan and again.step.iteration_time_s == got.iteration_time_s
    assert again.search_time_s > whole.search_time_s


def test_the_pass_is_skipped_past_the_time_limit_and_says_so():
    whole = run_planner(_problem(half_blocks=False))
    late = with_half_blocks(_problem(half_blocks=True), whole, time_limit_s=0.0)
    assert late.plan is whole.plan and "half-block pass skipped" in late.note


def test_tensor_parallel_and_fsdp_plans_stay_at_whole_blocks():
    p = _problem()
    got = run_planner(p)
    full = got.plan.model_copy(update={"sharding": "full"})
    assert not can_halve(full)
    assert halves_if_faster(p, full, got.step) == (full, got.step)


def test_a_baselines_plan_that_lost_at_whole_blocks_can_win_at_half_blocks():
    # dc-128 gpt3-13b (`bench/planner.py`): at whole blocks the data-balanced plan, sharded,
    # beats hpp's own and the layer-balanced ZB-V plan; at half blocks the layer-balanced plan
    # beats them all. The pass ran on hpp's result alone and kept the whole-block winner.
    cl = load_cluster(Path(__file__).parents[2] / "bench" / "scenarios" / "dc-128.yaml")
    whole = run_planner(problem(cl, "gpt3-13b", 512, 2048, sharding_mode="targeted",
                                half_blocks=False))  # fmt: skip
    p = problem(cl, "gpt3-13b", 512, 2048, sharding_mode="targeted", half_blocks=True)
    got = with_half_blocks(p, whole)
    assert "layer-balanced" in {r.strategy for r in whole.others}
    assert got.strategy == "hpp" and got.plan.strategy == "hpp"
    assert got.note == "the layer-balanced plan, at half blocks, was the best found"
    assert got.plan.model.layer_unit == "half"
    assert got.iteration_time_s < 0.97 * whole.iteration_time_s
    got.final_plan().validate_plan(cl)
    again = evaluate(_costing_problem(p, got.plan), got.plan)
    assert again.fits and again.iteration_time_s == got.iteration_time_s


def test_baselines_plans_out_of_reach_are_not_cut_at_half_blocks(monkeypatch):
    # 2 A100 + 2 RTX 4090: the baselines' plans are more than `BASELINE_REACH` slower than
    # hpp's, so only hpp's plan takes the (costly) re-split at half blocks
    whole = run_planner(_problem(half_blocks=False))
    best_s = with_half_blocks(_problem(half_blocks=True), whole).iteration_time_s
    tried, real = [], halves.halves_if_faster

    def counted(problem, plan, step):
        tried.append((plan.strategy, step.iteration_time_s))
        return real(problem, plan, step)

    monkeypatch.setattr(halves, "halves_if_faster", counted)
    with_half_blocks(_problem(half_blocks=True), whole)
    others = {r.strategy: r.iteration_time_s for r in whole.others}
    assert others and min(others.values()) > (1 + halves.BASELINE_REACH) * best_s
    assert [s for s, _ in tried] == ["hpp"]
    monkeypatch.setattr(halves, "BASELINE_REACH", 10.0)  # every one within reach
    tried.clear()
    with_half_blocks(_problem(half_blocks=True), whole)
    assert [s for s, _ in tried] == ["hpp", *sorted(others, key=others.get)]


def test_a_baselines_half_block_plan_must_save_the_passs_threshold():
    # edu-32 llama2-7b: the layer-balanced plan at half blocks is 0.45% faster than hpp's
    # whole-block plan, less than `HALF_MIN_GAIN`, which hpp's own plan must save too
    cl = load_cluster(Path(__file__).parents[2] / "bench" / "scenarios" / "edu-32.yaml")
    whole = run_planner(problem(cl, "llama2-7b", 128, 2048, sharding_mode="targeted",
                                half_blocks=False))  # fmt: skip
    p = problem(cl, "llama2-7b", 128, 2048, sharding_mode="targeted", half_blocks=True)
    (layer,) = [r for r in whole.others if r.strategy == "layer-balanced"]
    _, step = halves_if_faster(_costing_problem(p, layer.plan), layer.plan, layer.step)
    gain = 1 - step.iteration_time_s / whole.iteration_time_s
    assert 0 < gain < halves.HALF_MIN_GAIN
    got = with_half_blocks(p, whole)
    assert got.plan.model.layer_unit == "block" and got.step is whole.step
