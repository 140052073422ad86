"""The micro-batch cap: where a stage's memory grows with the micro-batches per step (GPipe's
in-flight activations; the multi-stage schedules' receive buffers, charged one per micro-batch),
the planner bounds each pipeline's m by memory; under 1F1B only the in-flight micro-batches hold
activations and receive buffers, so nothing past them caps m."""

from __future__ import annotations

import dataclasses

import pytest
from planner_cases import cluster, problem

from hetpp.cost.memory import most_micro_batches
from hetpp.planner import plan
from hetpp.planner.assemble import Pipe, build_plan, evaluate, pipe_group
from hetpp.planner.balance import allocate
from hetpp.planner.partition import equal_bounds
from hetpp.planner.shapes import UNBOUNDED, ShapeContext
from hetpp.specs.schedule import SCHEDULES


def test_most_micro_batches_is_the_largest_that_fits():
    def mem(m: int) -> float:
        return 10.0 + 3.0 * m

    assert most_micro_batches(mem, 40.0, 100) == 10  # 10 + 30 = 40 fits, 43 does not
    assert most_micro_batches(mem, 12.9, 100) == 0
    assert most_micro_batches(mem, 1e9, 100) == 100  # the limit itself fits: not bound


def _two_pipelines(schedule: str, batch: int):
    """A fast pipeline on 40 GB cards and a slower one on 48 GB cards: data balance gives the
    fast one most of the batch, more than its memory takes once the buffers are charged."""
    p = problem(cluster(("A100-40GB", 2, 1), ("A6000", 2, 1)), "gpt3-2.7b", batch, seq=2048)
    p = dataclasses.replace(p, train=p.train.model_copy(update={"schedule": schedule}))
    bounds = equal_bounds(p.layer_list_len, 2)
    return p, [Pipe((0, 1), bounds), Pipe((2, 3), bounds)]


def test_a_split_over_memory_is_rebalanced_within_the_cap():
    p, pipes = _two_pipelines("gpipe", 8)
    groups = [pipe_group(p, False, 1, q) for q in pipes]
    uncapped = allocate([dataclasses.replace(g, hi=UNBOUNDED) for g in groups], 8)[1]
    over = build_plan(p, False, 1, pipes, "test", micro_batches=[m[0] for m in uncapped])
    # Without the cap the fast pipeline's 40 GB stages hold more micro-batches than fit.
    assert not evaluate(p, over).fits
    assert uncapped[0][0] > groups[0].hi
    got = build_plan(p, False, 1, pipes, "test")
    assert got.pipelines[0].num_micro_batches <= groups[0].hi
    assert evaluate(p, got).fits
    assert sum(q.num_micro_batches for q in got.pipelines) == 8
    # The search finds a plan and it fits.
    result = plan(p, "hpp")
    assert result.feasible and result.step.fits


# The schedules pipelines are shaped under (multi-chunk ones are tried per pipeline afterwards,
# `planner.schedules`, and keep only plans that fit: `evaluate`).
def test_1f1b_is_not_capped_past_its_in_flight_micro_batches():
    p, pipes = _two_pipelines("1f1b", 1536)
    assert pipe_group(p, False, 1, pipes[0]).hi == UNBOUNDED
    result = plan(p, "hpp")
    assert result.feasible and result.step.fits


@pytest.mark.parametrize(
    "schedule",
    [n for n, s in SCHEDULES.items() if s.placement == "one" and not s.bounded_in_flight],
)
def test_every_growing_schedule_is_capped_and_every_plan_fits(schedule):
    p, pipes = _two_pipelines(schedule, 1536)
    cap = pipe_group(p, False, 1, pipes[0]).hi
    assert cap < p.micro_batches(1)
    # At the cap the fast pipeline fits, one micro-batch more does not (the registry's
    # in_flight and the buffers, for this schedule).
    total = p.micro_batches(1)
    for m, fits in ((cap, True), (cap + 1, False)):
        split = build_plan(p, False, 1, pipes, "test", micro_batches=[m, total - m])
        stages = [st for st in evaluate(p, split).stages if st.pipeline == 0]
        assert all(st.fits for st in stages) == fits
    # The template of the search caps the same way as the concrete pipeline.
    ctx = ShapeContext(p, False, 1)
    tables = [ctx.tables("a100-40gb")] * 2
    assert ctx.micro_batch_cap(tables, pipes[0].bounds) <= cap
    # The search never emits a plan over memory (GPipe: 1536 samples in flight fit nowhere).
    result = plan(p, "hpp")
    assert result.plan is None or result.step.fits
