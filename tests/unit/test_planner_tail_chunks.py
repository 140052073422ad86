"""`layout_tail` of a template run as two model chunks per device against the full cost.

Under an interleaved schedule a device has one gradient bucket per chunk, and a chunk's bucket
is ready once that chunk's last backward is done (`GradBucket.stages`, `cost.step.sync_buckets`).
A template carrying its chunks' cuts, devices and final-gradient times
(`TemplateCost.chunk_bounds`) must then get the full cost's tail exactly on one node with equal
pipelines, where nothing else differs; the one-chunk chain rule (one bucket per device, ready
at its 1F1B done time) does not.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from planner_cases import cluster, problem, small_model

from hetpp.cost.step import device_optimizer_time_s, step_cost
from hetpp.planner.assemble import build_plan, layout_pipes
from hetpp.planner.schedules import _chunked, _with_pipeline
from hetpp.planner.shapes import ShapeContext
from hetpp.planner.tail import layout_tail
from hetpp.specs.schedule import SCHEDULES


def _two_chunk_case():
    """Two 2-stage A100 pipelines on one node, moved to interleaved 1F1B at 2 chunks, and the
    one-chunk template they were built from."""
    p = problem(cluster(("A100-80GB", 4, 1)), small_model(8, 512), 32)
    ctx = ShapeContext(p, False, 1)
    t = next(t for t in ctx.orders((2,), exhaustive=True) if t.num_stages == 2)
    plan = build_plan(p, ctx.recompute, ctx.mbs, layout_pipes(p, [(t, 2)]), "test")
    spec = SCHEDULES["interleaved-1f1b"]
    for i, pipe in enumerate(plan.pipelines):
        plan = _with_pipeline(plan, i, _chunked(p, plan, pipe, spec, 2, "balanced"))
    return ctx, t, plan


def test_two_chunk_tail_matches_the_full_cost_per_chunk():
    ctx, t, plan = _two_chunk_case()
    step = step_cost(plan, ctx.cm)
    end = max(step.pipeline_time_s)
    assert len(set(step.pipeline_time_s)) == 1
    pipe = plan.pipelines[0]
    own = [s for s in step.stages if s.pipeline == 0]
    by_device = [[s for s in own if s.device == d] for d in pipe.devices]
    row = replace(
        t,
        opt_s=tuple(device_optimizer_time_s(ctx.cm, st, 1) for st in by_device),
        chunk_bounds=(own[0].layers[0], *(s.layers[1] for s in own)),
        chunk_devices=tuple(pipe.devices.index(s.device) for s in own),
        chunk_final_s=tuple(s.done_s - end for s in own),
    )
    tail = step.iteration_time_s - end
    # a device's later chunk is final before its earlier one: buckets per chunk overlap more
    assert len(step.buckets) == 4
    assert layout_tail(ctx, [(row, 2)]) == pytest.approx(tail, rel=1e-9, abs=1e-12)
    one_chunk = replace(row, chunk_bounds=(), chunk_devices=(), chunk_final_s=())
    assert layout_tail(ctx, [(one_chunk, 2)]) != pytest.approx(tail, rel=1e-3)
