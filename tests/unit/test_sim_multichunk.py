"""Multi-chunk schedules in the simulator: several stages per rank, split backwards (I, W)."""

import itertools

import numpy as np
import pytest
from test_sim_plan import EXAMPLES

from hetpp.cost.action_graph import path_ends_s
from hetpp.cost.memory import in_flight_counts, stage_memory
from hetpp.cost.pipeline import fill_and_beat, pipeline_time_s
from hetpp.cost.step import (
    cost_model_for_plan,
    device_memories,
    stage_costs,
    stage_layer_costs,
    step_cost,
)
from hetpp.sim import compare_with_cost, simulate_pipeline, simulate_plan
from hetpp.sim.schedule import format_actions, rank_actions
from hetpp.sim.trace import COMPUTE, Kind
from hetpp.specs import PRESETS, Plan, load_cluster
from hetpp.specs.plan import grad_buckets
from hetpp.specs.schedule import SCHEDULES

MULTI = [n for n, s in SCHEDULES.items() if s.multi_stage]
CHUNKS = {"one": (1,), "loop": (2, 3), "v": (2,)}
"""Chunk counts checked per placement."""
CHUNKED = [n for n, s in SCHEDULES.items() if s.placement != "one"]


def test_zbv_turn_is_local_and_weight_grads_send_nothing():
    # Two devices, stages 0-3 in a V: device 1 runs stages 1 and 2, handing over in memory.
    acts = format_actions(rank_actions("zbv", 1, 2, 2, chunks=2, optimizer=False))
    # torch's ZB-V for rank 1 of 2 and 2 micro-batches: F1 F2 F1 F2, then I and W per chunk
    assert acts == [
        "1RECV_F0", "1F0", "2F0", "2SEND_F0",
        "1RECV_F1", "1F1", "2F1", "2SEND_F1",
        "2RECV_B0", "2I0", "2W0", "1I0", "1SEND_B0", "1W0",
        "2RECV_B1", "2I1", "2W1", "1I1", "1SEND_B1", "1W1",
    ]  # fmt: skip


def test_interleaved_wraps_from_the_last_device_to_the_first():
    acts = format_actions(rank_actions("interleaved-1f1b", 0, 2, 2, chunks=2, optimizer=False))
    # stage 2 (device 0's second chunk) receives from stage 1 on device 1: the wrap
    assert acts[:6] == ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "2RECV_F0", "2F0"]


def _cases(spec):
    for num_ranks in range(1, 5):
        for chunks in CHUNKS[spec.placement]:
            for m in range(1, 13):
                if spec.micro_batch_problem(num_ranks * chunks, num_ranks, m) is None:
                    yield num_ranks, chunks, m


def _replays(name: str, seed: int, weight: float | None = None):
    """Every case of `_cases`, replayed with random forward times, backwards of twice that and
    weight-grad parts of `weight` times the forward (None: `weight_grad_s`'s split): yields
    (num_ranks, chunks, m), the forward, backward and W times, and the trace."""
    rng = np.random.default_rng(seed)
    for num_ranks, chunks, m in _cases(SCHEDULES[name]):
        num = num_ranks * chunks
        f = list(rng.uniform(0.5, 1.5, num))
        b, w = [2 * x for x in f], None if weight is None else [weight * x for x in f]
        tr = simulate_pipeline(f, b, [0.1] * (num - 1), m, name, num_ranks, w)
        yield (num_ranks, chunks, m), f, b, w, tr


@pytest.mark.parametrize("name", MULTI)
def test_every_order_runs_without_deadlock_and_does_every_step_once(name):
    spec = SCHEDULES[name]
    for (num_ranks, chunks, m), _, _, _, tr in _replays(name, 0):
        num = num_ranks * chunks
        for s in range(num):
            done = {k: sorted(tr.index[(tr.stage == s) & (tr.kind == k)]) for k in Kind}
            assert done[Kind.F] == list(range(m))
            # each micro-batch's backward runs whole (B) or as I then W, never both
            assert sorted(done[Kind.B] + done[Kind.I]) == list(range(m))
            assert sorted(done[Kind.B] + done[Kind.W]) == list(range(m))
        # a rank runs exactly the stages its placement gives it
        for r in range(num_ranks):
            mine = set(tr.stage[(tr.rank == r) & np.isin(tr.kind, [Kind.F])])
            assert mine == {s for s in range(num) if spec.device_index(s, num_ranks) == r}


@pytest.mark.parametrize("name", MULTI)
def test_in_flight_counts_the_replayed_peak(name):
    spec = SCHEDULES[name]
    for num_ranks, chunks, m in _cases(spec):
        num = num_ranks * chunks
        tr = simulate_pipeline([1.0] * num, [2.0] * num, [0.0] * (num - 1), m, name, num_ranks)
        # each stage's own peak, replayed: one micro-batch of that stage weighs 1, others 0
        for s in range(num):
            alone = np.zeros((num_ranks, num))
            alone[:, s] = 1.0
            peak = tr.activation_peak(alone, np.zeros(num_ranks))[spec.device_index(s, num_ranks)]
            assert spec.in_flight(s, num, m, num_ranks) == peak, (num_ranks, chunks, m, s)
        # their sum bounds the device's peak
        held = [
            sum(
                spec.in_flight(s, num, m, num_ranks)
                for s in range(num)
                if spec.device_index(s, num_ranks) == r
            )
            for r in range(num_ranks)
        ]
        assert all(np.asarray(tr.max_in_flight()) <= held), (num_ranks, chunks, m)


def test_interleaving_cuts_the_bubble_and_zero_bubble_cuts_it_further():
    # 4 devices, f = 1 and b = 2 per device and micro-batch, 8 micro-batches, free links: 1F1B
    # has a 3 x 3 s bubble; 2 chunks halve it; split backwards leave about a third of that.
    one = simulate_pipeline([1.0] * 4, [2.0] * 4, [0.0] * 3, 8).makespan_s
    inter = simulate_pipeline([0.5] * 8, [1.0] * 8, [0.0] * 7, 8, "interleaved-1f1b", 4)
    zb = simulate_pipeline([0.5] * 8, [1.0] * 8, [0.0] * 7, 8, "interleaved-zb", 4)
    assert one == 8 * 3 + 9
    assert inter.makespan_s == pytest.approx(8 * 3 + 4.5)
    assert 8 * 3 < zb.makespan_s < 8 * 3 + 4.5
    for trace, name in ((inter, "interleaved-1f1b"), (zb, "interleaved-zb")):
        closed = pipeline_time_s([0.5] * 8, [1.0] * 8, [0.0] * 7, 8, name, 4)
        assert closed == pytest.approx(trace.makespan_s, rel=0.05)


@pytest.mark.parametrize("name", MULTI)
def test_closed_form_within_5_percent_on_even_pipelines(name):
    spec = SCHEDULES[name]
    for num_ranks in (2, 3, 4):
        for chunks in CHUNKS[spec.placement]:
            num = num_ranks * chunks
            f, b = [1.0 / chunks] * num, [2.0 / chunks] * num
            c = [0.0 if spec.device_index(s, num_ranks) == spec.device_index(s + 1, num_ranks)
                 else 0.01 for s in range(num - 1)]  # fmt: skip
            for m in (2 * num_ranks, 4 * num_ranks):
                sim = simulate_pipeline(f, b, c, m, name, num_ranks).makespan_s
                closed = pipeline_time_s(f, b, c, m, name, num_ranks)
                assert closed == pytest.approx(sim, rel=0.05), (num_ranks, chunks, m)


def _chunked_plan(schedule: str, second: dict | None = None) -> Plan:
    """gpt3-1.3b on 4 A100s: one interleaved or V pipeline of 8 stages (zbh1: 4), and a 1F1B
    one on V100s (or `second`)."""
    cluster = load_cluster(EXAMPLES / "a100-v100.yaml")
    spec = SCHEDULES[schedule]
    bounds = [0, 7, 13, 19, 26] if spec.placement == "one" else [0, 4, 7, 10, 13, 16, 19, 22, 26]
    stages = [
        {"devices": [spec.device_index(s, 4)], "layers": [a, b]}
        for s, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    v100 = [{"devices": [16 + i], "layers": [a, b]} for i, (a, b) in enumerate([(0, 13), (13, 26)])]
    second = second or {"stages": v100, "micro_batch_size": 2, "num_micro_batches": 8}
    return Plan(
        global_batch=48 + second["micro_batch_size"] * second["num_micro_batches"],
        seq_len=2048,
        model=PRESETS["gpt3-1.3b"],
        cluster=cluster,
        pipelines=[
            {
                "stages": stages,
                "schedule": schedule,
                "micro_batch_size": 2,
                "num_micro_batches": 24,
            },
            second,
        ],
    ).validate_plan()


@pytest.mark.parametrize("name", MULTI)
def test_a_plan_mixing_schedules_simulates_and_agrees(name):
    plan = _chunked_plan(name)
    cm = cost_model_for_plan(plan)
    res = simulate_plan(plan, cm)
    assert [d.device for d in res.devices] == [0, 1, 2, 3, 16, 17]  # one rank per device
    agreement = compare_with_cost(plan, cm)
    assert abs(agreement.rel_diff) < 0.05 and abs(agreement.pipeline_rel_diff[0]) < 0.05
    # the cost model charges each device all its stages: never less than the replay's peak
    mem = device_memories(stage_costs(plan, cm)[0])
    for d in res.devices:
        assert d.peak_memory_bytes <= mem[d.device][0].total * (1 + 1e-12)
    assert step_cost(plan, cm).fits == res.fits


@pytest.mark.parametrize("name", MULTI)
def test_a_device_is_charged_its_replayed_activation_peak(name):
    # A device's stages peak at different moments: the cost model charges the device what its
    # replay holds at its own peak, not each stage's own peak summed (interleaved-zb on 4
    # devices: 12 micro-batches where the device never holds more than 8).
    plan = _chunked_plan(name)
    cm = cost_model_for_plan(plan)
    stages, _ = stage_costs(plan, cm)
    res = simulate_plan(plan, cm)
    rank = {d.device: r for r, d in enumerate(res.devices)}
    saved = np.zeros((len(res.devices), max(st.stage for st in stages) + 1))
    pending = np.zeros_like(saved)
    for st in stages:  # one micro-batch's bytes per stage, held and between I and W
        pipe = plan.pipelines[st.pipeline]
        costs = stage_layer_costs(cm, pipe.stages[st.stage], pipe.micro_batch_size)
        one = stage_memory(cm.model, cm.train, costs, *st.layers, 1, 0)
        saved[rank[st.device], st.stage] = one.activations
        schedule = pipe.schedule_in(plan.train)  # a V's turn keeps more
        place = (st.stage, len(pipe.stages), len(pipe.devices))
        one = stage_memory(
            cm.model, cm.train, costs, *st.layers, 0, 0, 1, schedule, place, num_pending=1
        )
        pending[rank[st.device], st.stage] = one.activations
    peak = res.trace.activation_peak(saved, np.zeros(len(res.devices)), pending)
    mem = device_memories(stages)
    for d in res.devices:
        assert mem[d.device][0].activations == pytest.approx(peak[rank[d.device]], rel=1e-12)


@pytest.mark.parametrize("name", MULTI)
def test_a_device_finishes_its_later_chunks_first(name):
    # So `grad_buckets`' one order (latest layers first) is each device's completion order of
    # its chunks' buckets: none waits in that order for a chunk the device finishes later.
    spec = SCHEDULES[name]
    for num_ranks, chunks, m in _cases(spec):
        for d in range(num_ranks):
            order = spec.order(d, num_ranks, chunks, m)
            last = {s: i for i, (kind, s, _) in enumerate(order) if kind in ("B", "W")}
            assert sorted(last, key=last.get) == sorted(last, reverse=True), (num_ranks, m, d)


@pytest.mark.parametrize("name", MULTI)
def test_grads_final_is_the_replays_last_gradient_step(name):
    # what the step cost times each chunk's bucket from: the end of the stage's last B or W
    for (num_ranks, chunks, m), f, b, w, tr in _replays(name, 1, weight=0.8):
        writes = np.isin(tr.kind, [Kind.B, Kind.W])
        replay = [tr.end[writes & (tr.stage == s)].max() for s in range(num_ranks * chunks)]
        comm = [0.1] * (num_ranks * chunks - 1)
        got = path_ends_s(f, b, comm, m, name, num_ranks, w).grads_final_s
        assert got == pytest.approx(replay, rel=1e-12), (num_ranks, chunks, m)


@pytest.mark.parametrize("name", CHUNKED)
def test_a_chunks_sync_starts_before_its_device_finishes_its_other_chunk(name):
    # Beside a one-stage pipeline (A100 4, a small batch share: it ends first), both chunks of
    # each device of pipeline 0 have the same owners, yet a bucket each (`grad_buckets`).
    alone = {"stages": [{"devices": [4], "layers": [0, 26]}], "micro_batch_size": 2,
             "num_micro_batches": 2}  # fmt: skip
    plan = _chunked_plan(name, alone)
    cm = cost_model_for_plan(plan)
    buckets = grad_buckets(plan)
    assert sorted(b.stages[0] for b in buckets) == list(range(8))
    assert len({b.owners for b in buckets}) == 4
    tr = simulate_plan(plan, cm).trace
    cost = step_cost(plan, cm)
    spec = SCHEDULES[name]
    for d in range(4):
        mine = tr.rank == d
        compute_end = tr.end[mine & np.isin(tr.kind, COMPUTE)].max()
        syncs = mine & (tr.kind == Kind.SYNC)
        assert tr.start[syncs].min() < compute_end  # overlaps the device's other chunk
        assert tr.start[mine & (tr.kind == Kind.OPT)][0] >= tr.end[syncs].max()
        # the cost model starts that chunk's bucket before the device is done too
        first = next(b for b in cost.buckets if b.owners[0] == d)
        assert spec.device_index(first.stages[0], 4) == d
        device_done = max(s.done_s for s in cost.stages if s.device == d)
        assert first.start_s < device_done


def test_same_device_stages_cost_no_transfer():
    plan = _chunked_plan("zbv")
    stages, _ = stage_costs(plan, cost_model_for_plan(plan))
    turn = [s for s in stages if s.pipeline == 0][3]  # stage 3 hands stage 4 over on device 3
    assert turn.device == 3 and turn.send_s == 0.0


@pytest.mark.parametrize("name", ["interleaved-1f1b", "interleaved-zb"])
@pytest.mark.parametrize("m", [4, 5, 6, 7])
def test_one_round_runs_the_chunks_as_flow_lines(name, m):
    # 4 devices, 2 chunks, m < 2D: one round. Device 0's first chunk holds the embedding (3 s),
    # device 3's second the head (3 s); every device's total is 4.5 s or less. Device 0 paces
    # the chunk-0 flows, device 3 its turn, one after the other: the busiest device's beat
    # alone was 25-29% short. The action graph is the replay here.
    f = [3.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 3.0]
    b = [2 * x for x in f]
    sim = simulate_pipeline(f, b, [0.0] * 7, m, name, 4).makespan_s
    assert pipeline_time_s(f, b, [0.0] * 7, m, name, 4) == pytest.approx(sim, rel=1e-9)
    busiest = max(f[d] + b[d] + f[d + 4] + b[d + 4] for d in range(4))
    assert fill_and_beat(f, b, [0.0] * 7, name, 4)[1] == busiest  # the steady line's beat


@pytest.mark.parametrize("m", [8, 16, 32])
def test_a_slow_hop_paces_a_zero_bubble_loop(m):
    # Interleaved zero-bubble on 4 devices, equal stages, one slow hop between devices 1 and 2
    # (both chunks cross it). Split backwards trail by one step per device, so the two devices
    # and the hop form a lock-step window: the hop adds itself to every micro-batch, which the
    # busiest device's beat missed by 8-13%.
    f, c = [1.0] * 8, [0.01, 1.0, 0.01, 0.01, 0.01, 1.0, 0.01]
    b = [2 * x for x in f]
    sim = simulate_pipeline(f, b, c, m, "interleaved-zb", 4).makespan_s
    closed = pipeline_time_s(f, b, c, m, "interleaved-zb", 4)
    assert fill_and_beat(f, b, c, "interleaved-zb", 4)[1] > 6.0  # more than the busiest device
    assert closed == pytest.approx(sim, rel=0.04)


@pytest.mark.parametrize("name", ["interleaved-1f1b", "interleaved-zb"])
@pytest.mark.parametrize("m", [4, 5, 6, 7])
def test_one_round_with_a_busiest_device_is_that_device_busy_throughout(name, m):
    # Device 1 holds both heavy chunks (12 s of work per micro-batch, the others 6 s), one
    # round: it runs from the first micro-batch's arrival to its last backward without a gap.
    # The steady line's fill and beat charged 4-11% more; the action graph is the replay.
    f = [1.0, 2.0, 1.0, 1.0, 1.0, 2.0, 1.0, 1.0]
    b = [2 * x for x in f]
    sim = simulate_pipeline(f, b, [0.0] * 7, m, name, 4).makespan_s
    busy = 1.0 + m * 12.0 + (0.0 if name == "interleaved-zb" else 2.0)  # arrive, work, return
    assert busy == pytest.approx(sim, rel=0.02)
    assert pipeline_time_s(f, b, [0.0] * 7, m, name, 4) == pytest.approx(sim, rel=0.02)


@pytest.mark.parametrize("name", MULTI)
def test_split_backwards_are_charged_what_torch_keeps_from_i_to_w(name):
    # torch's `stage_backward_input` keeps the weighted ops' output gradients until the W: the
    # split schedules hold some micro-batches between the two at a device's peak, whole
    # backwards (interleaved-1f1b) none. DualPipeV's devices peak at the end of its warm-up,
    # before any I: device 0's last stage, the one that held a pending micro-batch there, frees
    # more at its I (the logits, the loss's log-probabilities) than it keeps for the W.
    plan = _chunked_plan(name)
    cm = cost_model_for_plan(plan)
    pipe = plan.pipelines[0]
    costs = [stage_layer_costs(cm, st, pipe.micro_batch_size) for st in pipe.stages]
    counts = in_flight_counts(
        SCHEDULES[name], pipe.num_micro_batches, 4, costs, [st.layers for st in pipe.stages]
    )
    pending = [p for _, p in counts]
    assert all(p <= k for k, p in counts)
    held_at_peak = SCHEDULES[name].splits_backward and name != "dualpipev"
    assert (sum(pending) > 0) == held_at_peak, pending
