"""The default search ranks layouts by the schedule they run best under (`search._search_chunked`,
`planner.variants`), and the schedule pass tries V pipelines with their devices reversed."""

from __future__ import annotations

import pytest
from planner_cases import cluster, problem

import hetpp.planner.schedules as schedules
import hetpp.planner.search as search
from hetpp.planner import plan
from hetpp.planner.assemble import Pipe, build_plan
from hetpp.planner.exact import search_exact
from hetpp.planner.shapes import ShapeContext
from hetpp.planner.variants import best_variant
from hetpp.specs.schedule import SCHEDULES


def pair():
    return problem(cluster(("A100-80GB", 1, 1), ("RTX-4090", 1, 1)), "gpt3-1.3b", 16, seq=2048)


def test_the_pass_tries_a_v_pipeline_with_its_devices_reversed(monkeypatch):
    # RTX-4090 then A100 at micro-batch 4: ZB-V with the A100 first (it runs the embedding
    # and the head) is faster than the best multi-chunk schedule in that order (1.098 s
    # against 1.128 s since devices are charged their replayed activation peak; before, none
    # fitted in that order).
    p = pair()
    ctx = ShapeContext(p, False, 4)
    (t,) = [t for t in ctx.orders((1, 1), exhaustive=True) if t.runs[0][0] == "rtx-4090"]
    one = build_plan(p, False, 4, [Pipe((1, 0), t.bounds)], "hpp")
    got, cost = schedules.choose_schedules(p, one)
    pipe = got.pipelines[0]
    assert SCHEDULES[pipe.schedule].placement == "v" and cost.fits
    assert [p.cluster.gpu(d).name for d in pipe.devices] == ["A100-80GB", "RTX-4090"]
    monkeypatch.setattr(schedules, "_flips", lambda *a: (False,))
    _, kept = schedules.choose_schedules(p, one)
    assert cost.iteration_time_s < kept.iteration_time_s * (1 - 0.02)


def test_best_variant_prices_a_chunked_schedule_only_where_it_gains():
    p = problem(cluster(("A100-80GB", 4, 1)), "gpt3-1.3b", 64, seq=2048)
    ctx = ShapeContext(p, False, 1)
    deep = ctx.homogeneous("a100-80gb", 4)
    row, (base, name, chunks) = best_variant(ctx, deep, 16)
    assert base is deep and name in p.chunked_schedules and chunks == 2
    assert row.time(16) < deep.time(16) and row.runs == deep.runs and row.bounds == deep.bounds
    one = ctx.homogeneous("a100-80gb", 1)  # no bubble to remove
    assert best_variant(ctx, one, 16) == (one, (one, None, 1))


def test_the_default_search_finds_the_exact_chunked_layout_of_4_a100_4_rtx_4090(monkeypatch):
    # bench/search_quality.py's first cluster: ranked by 1F1B the search ended at 1.17089 s
    # (four RTX-4090 + A100 in ZB-V, micro-batch 2); the exact reference's four A100 + RTX-4090
    # in ZB-V at micro-batch 4 (1.15789 s) only win once chunked, the A100 first.
    def p():
        return problem(cluster(("A100-80GB", 4, 1), ("RTX-4090", 4, 1)), "gpt3-1.3b", 64, seq=2048)

    got = plan(p(), "hpp")
    exact = search_exact(p()).iteration_time_s
    # hpp's last pass (`planner.resplit`: cuts moved under the full step cost) goes past the
    # exact reference's plans (1.10931 s against 1.11267 s); without it the two are equal
    assert got.iteration_time_s <= exact * (1 + 1e-9)
    with monkeypatch.context() as m:
        m.setattr(search, "resplit_if_faster", lambda _, plan, step: (plan, step))
        assert plan(p(), "hpp").iteration_time_s == pytest.approx(exact, rel=1e-9)
    monkeypatch.setattr(search, "_search_chunked", lambda *a: None)
    assert got.iteration_time_s < plan(p(), "hpp").iteration_time_s * (1 - 0.005)


@pytest.mark.parametrize(
    ("model", "batch", "gain"),
    [
        # ranked by 1F1B the search ends at 1.92 s; the chunk-aware count DP's layouts reach
        # 1.58 s (bench/search_quality.py's batch 256 no longer differs since the I-to-W
        # gradients are charged: its ZB-V T4 pipelines overfill)
        ("gpt3-2.7b", 128, 0.05),
        # the pass's plan gains more from the last (micro-batch size) pass than the DP's best,
        # which was faster before it; both get that pass, so the DP never makes it slower
        ("gpt3-1.3b", 256, -1e-12),
    ],
)
def test_the_two_type_pass_ranks_layouts_by_their_chunked_schedules(
    monkeypatch, model, batch, gain
):
    # 4 H100 + 60 T4
    def p():
        return problem(cluster(("H100-80GB", 4, 1), ("T4", 4, 15)), model, batch, seq=2048)

    got = plan(p(), "hpp")
    monkeypatch.setattr(search, "_search_chunked", lambda *a: None)
    assert got.iteration_time_s <= plan(p(), "hpp").iteration_time_s * (1 - gain)


def test_a_three_type_cluster_takes_the_chunk_aware_count_dp(monkeypatch):
    # 4 A100 + 4 V100 + 4 T4, gpt3-2.7b (bench/search_quality.py): ranked by 1F1B the search
    # ended at 2.5217 s (four T4 + A100 + V100 pipelines, 1F1B); two deeper ZB-V pipelines win.
    def p():
        groups = (("A100-80GB", 4, 1), ("V100-16GB", 4, 1), ("T4", 4, 1))
        return problem(cluster(*groups), "gpt3-2.7b", 64, seq=2048)

    got = plan(p(), "hpp")
    monkeypatch.setattr(search, "CHUNKED_STATES", 0)
    assert got.iteration_time_s < plan(p(), "hpp").iteration_time_s * (1 - 0.05)
