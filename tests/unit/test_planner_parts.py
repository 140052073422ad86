"""Planner building blocks against hand computations and brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_cases import cluster, problem

from hetpp.cost.action_graph import path_ends_s
from hetpp.cost.memory import recv_buffer_counts, stage_memory, stage_memory_parts
from hetpp.cost.pipeline import LINE_WITHIN, busy_stage_bound_s, fill_and_beat, pipeline_time_s
from hetpp.planner import plan
from hetpp.planner.assemble import layout_key
from hetpp.planner.balance import PipelineGroup, allocate, balanced_time, balanced_times
from hetpp.planner.candidates import homogeneous_items, mixed_templates
from hetpp.planner.layout import (
    CountDP,
    TypeKnapsack,
    _unbounded,
    _values,
    layout_time,
    min_time,
)
from hetpp.planner.multisets import composition, count_multisets, multisets
from hetpp.planner.partition import balance_stages, balance_times, equal_bounds
from hetpp.planner.placement import _Free, place
from hetpp.planner.refine import _neighbours, estimate, refine
from hetpp.planner.shapes import ShapeContext, TemplateCost
from hetpp.specs import CATALOG
from hetpp.specs.schedule import SCHEDULES


def test_stage_memory_parts_match_stage_memory_for_every_range():
    p = problem(cluster(("A100-80GB", 1, 1)), "gpt3-350m", 8)  # tied embeddings
    for recompute in (False, True):
        cm = p.cost_model(recompute)
        costs = cm.layer_costs(CATALOG["a100-80gb"], 2)
        parts = stage_memory_parts(cm.model, cm.train, costs)
        for a, b in itertools.combinations(range(cm.model.layer_list_len + 1), 2):
            for (k, m), spec in itertools.product(((1, 1), (3, 5)), (None, SCHEDULES["1f1b"])):
                want = stage_memory(cm.model, cm.train, costs, a, b, k, m, schedule=spec).total
                acts, grads = recv_buffer_counts(spec, k, m)
                got = parts.fixed + k * parts.per_in_flight + acts * parts.per_activation_buffer
                got = got + grads * parts.per_gradient_buffer
                assert got[a, b] == pytest.approx(want, rel=1e-12)


def test_balance_stages_splits_identical_blocks_evenly_and_respects_memory():
    p = problem(cluster(("A100-80GB", 4, 1)), "gpt3-1.3b", 8)
    ctx = ShapeContext(p, False, 1)
    tables = [ctx.tables("a100-80gb")] * 2
    bounds = balance_stages(tables, [(1, 1, 1)] * 2)
    assert bounds[0] == 0 and bounds[-1] == 26
    # The head costs about two blocks, so the second stage takes fewer blocks.
    t = tables[0].time
    assert max(t[0, bounds[1]], t[bounds[1], 26]) == pytest.approx(
        min(max(t[0, c], t[c, 26]) for c in range(1, 26))
    )
    # A forced cut is honoured.
    assert 5 in balance_stages(tables, [(1, 1, 1)] * 3, forced=(5,))
    # More stages than layers, or memory too small: no split.
    assert balance_stages([tables[0]] * 27, [(1, 1, 1)] * 27) is None


def test_balance_stages_returns_none_when_memory_is_too_small():
    p = problem(cluster(("T4", 4, 1)), "gpt3-1.3b", 8, seq=2048)
    ctx = ShapeContext(p, False, 1)
    assert balance_stages([ctx.tables("t4")], [(1, 1, 1)]) is None  # 21 GB of state on a 16 GB card
    assert ctx.homogeneous("t4", 2) is None  # the first stage holds two micro-batches too
    assert ctx.homogeneous("t4", 3) is not None


@given(st.integers(1, 7), st.integers(1, 9), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_balance_times_is_the_brute_force_split(stages, layers, seed):
    # every split scored as the DP scores it: least bottleneck, then least total (summed stage
    # after stage from 0, as the DP adds) among splits within the bottleneck's hair; random
    # times (no ties) with ranges that do not fit (inf), as `StageTables.masked_time` gives
    rng = np.random.default_rng(seed)
    times = []
    for _ in range(stages):
        t = np.where(
            rng.random((layers + 1, layers + 1)) < 0.8, rng.random((layers + 1,) * 2), np.inf
        )
        times.append(np.where(np.triu(np.ones(t.shape, dtype=bool), 1), t, np.inf))
    splits = [(0, *c, layers) for c in itertools.combinations(range(1, layers), stages - 1)]
    if stages > layers or not splits:
        assert balance_times(times) is None
        return

    def worst(c):
        return max(t[a, b] for t, a, b in zip(times, c, c[1:]))

    tau = min(worst(c) for c in splits)
    if not math.isfinite(tau):
        assert balance_times(times) is None
        return
    within = [c for c in splits if worst(c) <= tau * (1 + 1e-12)]
    want = min(within, key=lambda c: sum(t[a, b] for t, a, b in zip(times, c, c[1:])))
    assert balance_times(times) == want


def test_equal_bounds():
    assert equal_bounds(10, 3) == (0, 4, 7, 10)
    assert equal_bounds(4, 4) == (0, 1, 2, 3, 4)


@given(
    st.lists(st.floats(1e-3, 1.0), min_size=1, max_size=5),
    st.lists(st.floats(1e-3, 1.0), min_size=5, max_size=5),
    st.lists(st.floats(0.0, 0.1), min_size=4, max_size=4),
    st.integers(1, 9),
    st.sampled_from(["1f1b", "gpipe"]),
)
@settings(max_examples=40, deadline=None)
def test_fill_and_beat_match_pipeline_time(fwd, bwd, comm, m, schedule):
    # GPipe's time is its line; 1F1B's where the line is within LINE_WITHIN of the busy-stage
    # bound, the action graph's elsewhere (`TimingRule.graph_past`)
    bwd, comm = bwd[: len(fwd)], comm[: len(fwd) - 1]
    fill, beat = fill_and_beat(fwd, bwd, comm, schedule)
    line, got = fill + (m - 1) * beat, pipeline_time_s(fwd, bwd, comm, m, schedule)
    near = line <= (1 + LINE_WITHIN) * busy_stage_bound_s(fwd, bwd, comm, m)
    if schedule == "gpipe" or near:
        assert line == pytest.approx(got)
    else:
        assert got == path_ends_s(fwd, bwd, comm, m, schedule, len(fwd), bwd).devices_s.max()


def test_allocate_by_hand():
    # Two pipelines: a fast one (1 s per micro-batch) and a slow one (2 s), both 1 s to fill.
    kinds = [PipelineGroup(1.0, 1.0, 1, 100), PipelineGroup(2.0, 2.0, 1, 100)]
    t, counts = allocate(kinds, 9)
    assert counts == [[6], [3]] and t == 6.0
    # 1F1B minimum: a 4-stage pipeline needs >= 4 micro-batches even if that is slower.
    t, counts = allocate([PipelineGroup(1.0, 1.0, 1, 100), PipelineGroup(8.0, 2.0, 4, 100)], 6)
    assert counts == [[2], [4]] and t == 14.0
    assert allocate([PipelineGroup(1.0, 1.0, 4, 100, count=2)], 7) is None  # needs 8


@given(
    st.lists(
        st.tuples(
            st.floats(0.1, 5),
            st.floats(0.05, 2),
            st.integers(1, 4),
            st.integers(1, 8),
            st.integers(1, 2),
            st.floats(0, 0.5),
        ),
        min_size=1,
        max_size=2,
    ),
    st.integers(1, 20),
)
@settings(max_examples=60, deadline=None)
def test_balance_is_optimal_against_brute_force(spec, total):
    kinds = [PipelineGroup(f, b, lo, max(lo, hi), n, tail) for f, b, lo, hi, n, tail in spec]
    pipes = [k for k in kinds for _ in range(k.count)]
    best = math.inf
    for ms in itertools.product(*[range(k.lo, k.hi + 1) for k in pipes]):
        if sum(ms) == total:
            best = min(best, max(k.time(m) for k, m in zip(pipes, ms)))
    got = allocate(kinds, total)
    arr = [
        np.array([getattr(k, a) for k in kinds], dtype=float)
        for a in ("fill_s", "beat_s", "lo", "hi", "count", "tail_s")
    ]
    t_one = balanced_time(*arr[:5], total, arr[5])
    t_many = balanced_times(*arr[:5], total, arr[5])[0]
    if best == math.inf:
        assert got is None and t_one == math.inf and t_many == math.inf
        return
    t, counts = got
    assert t == pytest.approx(best) and t_one == pytest.approx(best)
    assert t_many == pytest.approx(best)
    assert sum(map(sum, counts)) == total
    assert all(k.lo <= m <= k.hi for k, ms in zip(kinds, counts) for m in ms)


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.integers(0, 20), st.data())
@settings(max_examples=40, deadline=None)
def test_unbounded_knapsack_against_brute_force(weights, capacity, data):
    values = np.array([data.draw(st.integers(0, 9)) for _ in weights], dtype=float)
    f, _ = _unbounded(weights, values, capacity)
    for w in range(capacity + 1):
        best = 0
        for ns in itertools.product(*[range(w // d + 1) for d in weights]):
            if sum(n * d for n, d in zip(ns, weights)) <= w:
                best = max(best, sum(n * v for n, v in zip(ns, values)))
        assert f[w] == best


def test_min_time_exact_dp_equals_enumeration():
    p = problem(cluster(("A100-80GB", 2, 1), ("RTX-4090", 2, 1)), "gpt3-1.3b", 16, seq=2048)
    ctx = ShapeContext(p, False, 1)
    comps = [c for c in itertools.product(range(3), range(3)) if any(c)]
    templates = [(c, t) for c in comps for t in ctx.orders(c)]
    dp = CountDP(templates, ctx.counts, 16, True)
    t, _ = min_time(dp, 16, use_tail=False)
    best = min(
        layout_time([(templates[i][1], k) for i, k in ms], 16, False)
        for ms in multisets([c for c, _ in templates], ctx.counts)
    )
    assert t == pytest.approx(best)
    # The per-type knapsack agrees on homogeneous templates alone.
    items = {k: [x for x in (ctx.homogeneous(k, d) for d in (1, 2)) if x] for k in ctx.keys}
    homo = [(c, t) for c, t in templates if sum(1 for x in c if x) == 1]
    t_dp, _ = min_time(CountDP(homo, ctx.counts, 16, True), 16, False)
    t_ks, _ = min_time(
        TypeKnapsack(items, dict(zip(ctx.keys, ctx.counts)), [], 16, False, True), 16, False
    )
    assert t_ks == pytest.approx(t_dp)


@given(st.integers(0, 2**32 - 1), st.booleans())
@settings(max_examples=40, deadline=None)
def test_count_dp_answers_as_a_scalar_dp_breaks_ties(seed, budget):
    # the state by state DP in flat index order (the first count of each type varying
    # fastest), the first best template per state, the first best allowed state: few
    # distinct capacities, so ties are common
    rng = np.random.default_rng(seed)
    counts = tuple(int(n) for n in rng.integers(1, 4, size=2))
    comps = [c for c in itertools.product(*(range(n + 1) for n in counts)) if any(c)]
    templates = []
    for _ in range(int(rng.integers(1, 8))):
        comp = comps[int(rng.integers(len(comps)))]
        fill, beat = float(rng.integers(0, 3)), float(rng.integers(1, 3))
        runs = tuple((f"t{i}", n) for i, n in enumerate(comp) if n)
        cost = TemplateCost(runs, (0, 1), (), (), (), fill, beat, 1, 1 << 40, 0.0, (), ())
        templates.append((comp, cost))
    total, t = 4, 4.0
    dp = CountDP(templates, counts, total, budget)
    value, layout = dp(t)
    vals = _values(dp.arrays, t, total, False)
    g = {}
    best_of: dict[tuple, int] = {}
    flat = [s[::-1] for s in itertools.product(*(range(n + 1) for n in reversed(counts)))]
    for s in sorted(flat, key=sum):  # by device count, flat order within one (stable)
        if not any(s):
            g[s] = 0.0
            continue
        g[s] = -math.inf
        for k, (comp, _) in enumerate(templates):
            prev = tuple(a - c for a, c in zip(s, comp))
            got = g.get(prev, -math.inf) + (vals[k] if vals[k] > 0 else -math.inf)
            if min(prev) >= 0 and got > g[s]:
                g[s], best_of[s] = got, k
    ok = [s for s in flat if not budget or sum(s) <= total]
    s = max(ok, key=lambda x: g[x])  # the first largest, in flat order
    assert value == g[s]
    want: dict[int, int] = {}
    while any(s):
        k = best_of[s]
        want[k] = want.get(k, 0) + 1
        s = tuple(a - c for a, c in zip(s, templates[k][0]))
    assert layout == [(templates[k][1], n) for k, n in sorted(want.items())]


def test_count_multisets_matches_enumeration():
    comps = [(1, 0), (0, 1), (1, 1), (2, 1)]
    assert count_multisets(comps, (3, 2)) == len(multisets(comps, (3, 2))) == 24


def test_placement_keeps_runs_inside_nodes_when_it_can():
    p = problem(cluster(("A100-80GB", 4, 2), ("RTX-4090", 4, 1)), "gpt3-350m", 8)
    got = place(p, [(("a100-80gb", 3),), (("a100-80gb", 3),), (("rtx-4090", 2), ("a100-80gb", 2))])
    nodes = [{p.cluster.devices[d].node for d in devs} for devs in got]
    assert nodes[0] == {0} or nodes[0] == {1}
    assert len(nodes[1]) == 1 and nodes[0] != nodes[1]
    assert len({d for devs in got for d in devs}) == 10
    assert place(p, [(("rtx-4090", 5),)]) is None


def test_free_devices_best_fit_then_spread_lowest_index_on_ties():
    free = _Free([[0, 1, 2, 3], [4, 5], [6, 7, 8], []])
    assert free.take(2) == [4, 5]  # node 1 fits exactly
    assert free.take(3) == [6, 7, 8]  # node 2 is fuller than node 0
    assert free.take(1) == [0]
    assert free.take(4) is None  # 3 left
    free = _Free([[0, 1], [2, 3, 4], [5, 6, 7]])
    assert free.take(5) == [2, 3, 4, 5, 6]  # no node fits: most free first, node 1 on the tie
    assert free.take(3) == [0, 1, 7]  # node 0 has 2 free, node 2 has 1
    assert free.total == 0


def test_local_moves_improve_the_estimate_and_respect_device_counts():
    p = problem(cluster(("L40S", 8, 1), ("A100-80GB", 8, 1)), "gpt3-13b", 128, seq=2048)
    ctx = ShapeContext(p, False, 1)
    start = [(ctx.best((4, 4)), 2)]  # (L40S, A100): the layer-balanced shape, twice
    path = refine(ctx, start)
    assert path
    scores = [estimate(ctx, lay) for lay in [start, *path]]
    assert all(b < a for a, b in itertools.pairwise(scores))
    for lay in path:
        used = [sum(composition(ctx, t)[j] * k for t, k in lay) for j in range(len(ctx.keys))]
        assert all(u <= n for u, n in zip(used, ctx.counts))


def test_local_moves_trade_devices_of_two_types_between_pipelines():
    p = problem(cluster(("A100-80GB", 3, 1), ("V100-16GB", 5, 1), ("T4", 7, 1)), "gpt3-2.7b", 64)
    ctx = ShapeContext(p, False, 1)  # keys: a100, v100, t4
    start = [(ctx.best((1, 1, 2)), 1), (ctx.best((1, 2, 2)), 1)]
    traded = [(ctx.orders((1, 0, 3))[1], 1), (ctx.orders((1, 3, 1))[0], 1)]
    # Trades every round (not only in the wide moves), in second-best orders too.
    assert layout_key(traded) in {layout_key(lay) for lay in _neighbours(ctx, start)}
    moved = list(_neighbours(ctx, start, wide=True))
    orders = {tuple(sorted((t.runs for t, _ in lay), key=str)) for lay in moved}
    second = ctx.orders((1, 1, 2))[1].runs
    assert any(second in runs for runs in orders)  # a composition in its second-best order


def test_default_search_is_within_a_percent_of_exact_on_three_mixed_shapes():
    # The exact search (bench/search_quality.py, limits lifted) finds 2.64315 s (V100 transfer
    # 0.8); at 4566e29 the default finds 2.42247 s, below it: three pipelines of 1 A100 + 4 T4,
    # 1 A100 + 3 T4 + 2 V100 and 1 A100 + 3 V100, all ZB-V after the schedule pass, which the
    # exact search (exact in one-chunk compute time) does not rank first. At c588b4a, before
    # the joint merge's schedule pass, the same shapes in 1F1B were 2.71325 s (+2.65%). At a
    # V100 transfer of 1.0 the exact plan was 4 T4 + A100, 2 T4 + A100 + V100, T4 + 4 V100 +
    # A100, reached only with second-best stage orders and trades every round in the local moves.
    groups = (("A100-80GB", 3, 1), ("V100-16GB", 5, 1), ("T4", 7, 1))
    got = plan(problem(cluster(*groups), "gpt3-2.7b", 64, seq=2048), "hpp")
    assert got.iteration_time_s <= 2.6431450801703034 * 1.01


def test_local_moves_split_half_the_copies_of_a_template_at_once():
    groups = (("A100-80GB", 4, 1), ("V100-16GB", 4, 1), ("T4", 4, 1))
    ctx = ShapeContext(problem(cluster(*groups), "gpt3-2.7b", 64, seq=2048), False, 1)
    start = [(ctx.best((1, 1, 1)), 4)]  # keys: a100, v100, t4
    comps = {
        tuple(sorted((composition(ctx, t), k) for t, k in lay)) for lay in _neighbours(ctx, start)
    }
    assert (((1, 0, 1), 2), ((1, 2, 1), 2)) in comps


def test_default_search_is_within_a_percent_of_exact_on_two_by_two_shapes():
    # The exact search (bench/search_quality.py) finds 2.52167 s with the V100 transfer at 0.8
    # (issue 12), and so does the default search. At 1.0 exact was 2.43834 s: two T4 + A100 and
    # two T4 + 2 V100 + A100; from four T4 + A100 + V100 (2.498 s) one pair at a time the
    # estimate rose first, two pairs at once reached it.
    groups = (("A100-80GB", 4, 1), ("V100-16GB", 4, 1), ("T4", 4, 1))
    got = plan(problem(cluster(*groups), "gpt3-2.7b", 64, seq=2048), "hpp")
    assert got.iteration_time_s <= 2.5216712449780703 * 1.01


def test_shapes_for_the_count_dp_take_a_few_of_either_type_and_every_count_of_the_other():
    # 16 H100 + 16 A100-40GB, llama3-8b: the exact plan's 3 A100-40GB + 8 H100 has its few
    # devices on the type with less memory, and more of the other than the walk's shapes take.
    p = problem(cluster(("H100-80GB", 8, 2), ("A100-40GB", 8, 2)), "llama3-8b", 256, seq=2048)
    ctx = ShapeContext(p, False, 1)  # keys: h100, a100
    items = homogeneous_items(ctx)
    walk = {composition(ctx, t) for t in mixed_templates(ctx, items)}
    every = {composition(ctx, t) for t in mixed_templates(ctx, items, every=True)}
    assert walk <= every
    assert (8, 3) in every and (8, 3) not in walk
    assert all(h <= 4 or a <= 4 for h, a in every)
    # Every count of the other type from the fewest that fit up to all of them.
    assert {h for h, a in every if a == 3} == set(range(min(h for h, a in every if a == 3), 17))


def test_default_search_is_within_a_percent_of_exact_on_few_of_one_type_next_to_many():
    # The exact search (bench/search_quality.py) finds 3.19548 s: two 3 A100-40GB + 8 H100 next
    # to 10 A100-40GB. The walk over (shape, copies) options by their bound never reached that
    # option (201st of 240); the count DP over shapes with a few of either type does.
    # Re-recorded when 1F1B stages were charged their live receive buffers only (branch
    # recvbuf): the exact search (search.EXACT_STATES = EXACT_TEMPLATES = 10**9) on this problem
    # then finds 3.24583 s (10 + 11 + 11 stages), as the default search does; the earlier
    # 8 x 8-stage ZBV plan (3.21609 s) still costs that, but the search sizes shapes under
    # 1F1B, whose stages now take more layers, and the schedule pass starts from those.
    groups = (("H100-80GB", 8, 2), ("A100-40GB", 8, 2))
    got = plan(problem(cluster(*groups), "llama3-8b", 256, seq=2048), "hpp")
    assert got.iteration_time_s <= 3.2458310970499205 * 1.01


def test_default_search_is_within_a_percent_of_exact_on_five_different_mixed_shapes():
    # The exact search (bench/search_quality.py, 5-25 s here) finds 5.84175 s: 2 A100 +
    # 13 RTX-4090, 3 A100 + 12 RTX-4090, four RTX-4090 + 5 A100 and 3 RTX-4090 + 7 A100; the
    # default returned the layer-balanced plan (+3.9%) until the count DP took the mixed shapes.
    groups = (("A100-80GB", 8, 4), ("RTX-4090", 8, 4))
    got = plan(problem(cluster(*groups), "llama2-7b", 512, seq=2048), "hpp")
    assert got.iteration_time_s <= 5.841753916521607 * 1.01


@pytest.mark.parametrize("counts", [(3,), (2, 3), (3, 0, 2), (2, 2, 3)])
def test_count_multisets_matches_enumeration_for_every_subset(counts):
    every = [c for c in itertools.product(*[range(n + 1) for n in counts]) if sum(c)]
    for k in range(0, len(every) + 1, 3):
        comps = every[k:] + every[: k // 2]
        assert count_multisets(comps, counts) == len(multisets(comps, counts))
