"""The planner's tail estimate (sync + optimizer after the slowest pipeline) against `step_cost`.

`layout_tail` costs a layout of templates without placing it, assuming every pipeline ends
with the slowest one and the best links. The placed plan's full step can only do as well or
better: pipelines that end earlier start their sync earlier, real hops are no faster than the
best ones (so stages finish no later), and a ring inside one node is no slower than the
layout's ring. On one node nothing differs and the two must agree.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from planner_cases import cluster, problem, small_model

from hetpp.cost.step import step_cost
from hetpp.planner.assemble import build_plan, layout_pipes
from hetpp.planner.multisets import compositions
from hetpp.planner.shapes import ShapeContext
from hetpp.planner.tail import layout_tail

TYPES = ["A100-80GB", "H100-80GB", "RTX-4090", "L4"]


@st.composite
def layouts(draw):
    """A small cluster (one or two types, one or two nodes each), a model, a setting, and a
    layout of one or two templates with copies that the cluster can hold."""
    groups = [(draw(st.sampled_from(TYPES)), draw(st.sampled_from([1, 2, 4])), 1)]
    if draw(st.booleans()):
        groups[0] = (groups[0][0], groups[0][1], draw(st.integers(1, 2)))
        other = draw(st.sampled_from([t for t in TYPES if t != groups[0][0]]))
        groups.append((other, draw(st.sampled_from([1, 2])), draw(st.integers(1, 2))))
    cl = cluster(*groups, inter=draw(st.sampled_from([5.0, 25.0])))
    model = draw(st.sampled_from(["gpt3-350m", "small"]))  # gpt3-350m ties embedding and head
    spec = small_model(draw(st.integers(2, 8)), 512) if model == "small" else model
    schedule = draw(st.sampled_from(["1f1b", "gpipe"]))
    p = problem(cl, spec, draw(st.sampled_from([16, 32, 64])))
    p.train = p.train.model_copy(update={"schedule": schedule})
    ctx = ShapeContext(p, draw(st.booleans()), draw(st.sampled_from([1, 2])))
    templates = [t for c in compositions(ctx) for t in ctx.orders(c, exhaustive=True)]
    if not templates:
        return ctx, []
    picks = draw(st.lists(st.sampled_from(templates), min_size=1, max_size=2, unique=True))
    layout = [(t, draw(st.integers(1, 3))) for t in picks]
    if layout_pipes(p, layout) is None:
        layout = [(picks[0], 1)]
    return ctx, layout


@given(layouts())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_layout_tail_bounds_the_placed_plans_tail_and_is_exact_on_one_node(case):
    ctx, layout = case
    if not layout:
        return  # nothing of this model fits this cluster
    p = ctx.problem
    pipes = layout_pipes(p, layout)
    plan = build_plan(p, ctx.recompute, ctx.mbs, pipes, "test")
    if plan is None:
        return  # the batch cannot be split over these pipelines
    step = step_cost(plan, ctx.cm)
    tail = step.iteration_time_s - max(step.pipeline_time_s)
    estimate = layout_tail(ctx, layout)
    event("exact" if p.num_nodes == 1 and len(set(step.pipeline_time_s)) == 1 else "bound")
    assert tail <= estimate * (1 + 1e-9) + 1e-12
    if p.num_nodes == 1 and len(set(step.pipeline_time_s)) == 1:
        assert tail == pytest.approx(estimate, rel=1e-9, abs=1e-12)
