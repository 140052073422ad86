"""Recomputation per stage: the planner keeps it only on stages that do not fit without it, and
the cost model charges each stage by its own flag."""

from __future__ import annotations

from planner_cases import block_problem as problem
from planner_cases import cluster

from hetpp.cost.memory import stage_memory
from hetpp.cost.step import step_cost
from hetpp.planner import plan
from hetpp.planner.assemble import evaluate
from hetpp.specs.plan import Plan
from hetpp.specs.schedule import SCHEDULES


def _all(p: Plan, recompute: bool | None) -> Plan:
    pipes = tuple(
        pp.model_copy(
            update={
                "stages": tuple(s.model_copy(update={"recompute": recompute}) for s in pp.stages)
            }
        )
        for pp in p.pipelines
    )
    return p.model_copy(update={"pipelines": pipes})


def test_recompute_stays_only_where_a_stage_needs_it():
    # gpt3-6.7b on 2 A100-80GB + 4 V100-16GB, recomputation forced on for the search.
    prob = problem(
        cluster(("A100-80GB", 2, 1), ("V100-16GB", 4, 1)),
        "gpt3-6.7b",
        32,
        seq=2048,
        recompute_mode="on",
    )
    got = plan(prob, "hpp").final_plan()
    flags = [s.recomputes(got.train) for pp in got.pipelines for s in pp.stages]
    assert got.train.recompute and True in flags and False in flags
    cm = prob.cost_model(False)
    for pp in got.pipelines:
        for i, st in enumerate(pp.stages):
            gpu = prob.cluster.gpu(st.device)
            costs = cm.layer_costs(gpu, pp.micro_batch_size, recompute=False)
            m = pp.num_micro_batches
            spec = SCHEDULES[got.schedule]
            k = spec.in_flight(i, len(pp.stages), m)
            mem = stage_memory(cm.model, cm.train, costs, *st.layers, k, m, schedule=spec)
            fits = mem.total <= gpu.memory_bytes
            assert st.recomputes(got.train) == (not fits), (i, st)
    # Dropping recomputation where it is not needed only makes the step faster; still fits.
    step = evaluate(prob, got)
    assert step.fits and step.iteration_time_s < evaluate(prob, _all(got, None)).iteration_time_s


def test_step_cost_charges_each_stage_by_its_own_flag():
    prob = problem(cluster(("A100-80GB", 2, 1)), "gpt3-1.3b", 8, seq=2048, recompute_mode="on")
    base = plan(prob, "hpp").final_plan()
    cm = prob.cost_model(True)
    on, off = step_cost(_all(base, True), cm), step_cost(_all(base, False), cm)
    for a, b in zip(on.stages, off.stages):
        assert a.fwd_s == b.fwd_s and a.bwd_s > b.bwd_s  # the recomputed forward
        assert a.memory.activations < b.memory.activations
        assert a.memory.weights == b.memory.weights
