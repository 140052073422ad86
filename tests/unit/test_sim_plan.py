"""Simulating plans: stage times from injected profiles, block all-reduce, memory replay."""

from pathlib import Path

import pytest
import simcases

from hetpp.cost.step import cost_model_for_plan, stage_costs, step_cost
from hetpp.sim import compare_with_cost, plan_programs, simulate_plan
from hetpp.sim.trace import Kind
from hetpp.specs import PRESETS, Plan, load_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

HALF = (0, 3)  # embedding + 2 blocks
REST = (3, 6)  # 2 blocks + head
ALL = (0, 6)
SEND = 128 * 64 * 2  # one activation of tiny-llama at seq 128: 16384 bytes


def test_two_stage_1f1b_from_profiles_by_hand():
    # Fast device 0 then Slow device 2 (next node, 1 GB/s): f = (0.02, 0.04), b = (0.04, 0.08),
    # c = 16384 B / 1 GB/s. The last stage paces: 0.06 + 0.12 + 2c + 3 x 0.12.
    plan = simcases.plan([([(0, HALF), (2, REST)], 4)])
    res = simulate_plan(plan, simcases.cost_model(plan))
    c = SEND / 1e9
    assert res.pipeline_time_s[0] == pytest.approx(0.54 + 2 * c, rel=1e-12)
    tr = res.trace
    # stage 1 runs its 4 forward/backward pairs back to back once the first activation arrives
    sel = (tr.rank == 1) & (tr.kind == Kind.B)
    assert list(tr.start[sel]) == pytest.approx([0.02 + c + 0.04 + k * 0.12 for k in range(4)])
    # one pipeline: its buckets are one-member all-reduces (0 s), except the tied-free model's
    # none; the step ends with the slower optimizer
    assert res.iteration_time_s == pytest.approx(tr.end[tr.kind == Kind.OPT].max())
    assert res.exposed_sync_s == 0
    assert res.bubble_fraction == pytest.approx(
        1 - 4 * (0.06 + 0.12) / (2 * res.pipeline_time_s[0])
    )


def test_block_allreduce_waits_for_the_slower_pipeline():
    # Pipeline 0: one Fast stage with all layers (0.06 + 0.12 per micro-batch, 4 of them: 0.48 s).
    # Pipeline 1: two Slow stages (0.12 each; (4 + 1) x 0.12 = 0.60 s). Blocks [0,3) owned by
    # devices (0, 2) and [3,6) by (0, 3); the first waits for device 2, done at 0.60.
    plan = simcases.plan([([(0, ALL)], 4), ([(2, HALF), (3, REST)], 4)])
    cm = simcases.cost_model(plan)
    res = simulate_plan(plan, cm)
    tr = res.trace
    assert res.pipeline_time_s == pytest.approx((0.48, 0.60 + 2 * SEND / 1e13))
    buckets = (tr.kind == Kind.SYNC) & (tr.index < 2)  # collective 2: the gradient norm's
    syncs = sorted(zip(tr.index[buckets], tr.start[buckets], tr.end[buckets]))
    # Buckets go latest layers first: [3,6) on devices (0, 3), then [0,3) on devices (0, 2).
    (c0, s0, e0), (_, s0b, _), (c1, s1, e1), _ = syncs
    assert (c0, c1) == (0, 1) and s0 == s0b  # both owners start together
    last_b = {d: tr.end[(tr.rank == d) & (tr.kind == Kind.B)].max() for d in (0, 1, 2)}
    assert s0 == pytest.approx(max(last_b[0], last_b[2]))  # device 3 is rank 2 here
    assert s0 < res.pipeline_time_s[1]  # overlaps pipeline 1's last backward on its first stage
    layers = cm.model.layers
    dur1 = sum(x.params for x in layers[0:3]) * 2 / 1e9  # 2(P-1)/P = 1 for P = 2, 1 GB/s
    # [0,3) waits for the slower pipeline's first stage, done at 0.60
    assert s1 == pytest.approx(max(res.pipeline_time_s[1], e0))
    assert s1 > res.pipeline_time_s[0]
    assert e1 - s1 == pytest.approx(dur1)
    assert res.exposed_sync_s == pytest.approx(e1 - res.pipeline_time_s[1])
    # device 0 sat idle from 0.48 to 0.60 waiting for its partner
    dev0 = res.devices[0]
    assert dev0.sync_fraction * res.iteration_time_s == pytest.approx((e0 - s0) + (e1 - s1))
    closed = step_cost(plan, cm)
    # equal up to the nanosecond transfers inside pipeline 1
    assert closed.iteration_time_s == pytest.approx(res.iteration_time_s, rel=1e-8)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_replayed_peak_memory_matches_the_in_flight_formula(schedule):
    plan = simcases.plan([([(0, HALF), (1, REST)], 4)], schedule)
    cm = simcases.cost_model(plan)
    res = simulate_plan(plan, cm)
    held = [d.max_in_flight for d in res.devices]
    assert held == ([2, 1] if schedule == "1f1b" else [4, 4])
    stages, _ = stage_costs(plan, cm)
    for d, st in zip(res.devices, stages):
        assert d.peak_memory_bytes == pytest.approx(st.memory.total)


def test_gpipe_holds_more_than_1f1b():
    mem = {}
    for schedule in ("1f1b", "gpipe"):
        plan = simcases.plan([([(0, HALF), (1, REST)], 4)], schedule)
        mem[schedule] = [
            d.peak_memory_bytes for d in simulate_plan(plan, simcases.cost_model(plan)).devices
        ]
    # Per micro-batch in flight, stage 0 also keeps its output (torch's stage does, until the
    # backward); stage 1's input is a receive buffer, live while its micro-batch is in flight.
    sent = simcases.cost_model(plan).model.layers[HALF[1] - 1].send_bytes_per_sample
    saved0 = simcases.ACT["embedding"] + 2 * simcases.ACT["block"] + sent
    saved1 = 2 * simcases.ACT["block"] + simcases.ACT["head"]
    assert mem["gpipe"][0] - mem["1f1b"][0] == pytest.approx(2 * saved0)  # 4 held instead of 2
    assert mem["gpipe"][1] - mem["1f1b"][1] == pytest.approx(3 * saved1)  # 4 instead of 1


def test_every_rank_joins_buckets_in_one_order():
    plan = simcases.plan([([(0, ALL)], 4), ([(2, HALF), (3, REST)], 4)])
    programs, collectives = plan_programs(plan, simcases.cost_model(plan))
    orders = [[a.microbatch for a in p.actions if a.kind == "SYNC"] for p in programs]
    # bucket 0 is the later layers [3,6) on devices 0, 3; 2 the gradient norm's, on every rank
    assert orders == [[0, 1, 2], [1, 2], [0, 2]]
    assert [c.members for c in collectives] == [(0, 2), (0, 1), (0, 1, 2)]


def test_realistic_plan_agrees_with_closed_form_and_fits():
    cluster = load_cluster(EXAMPLES / "a100-v100.yaml")
    stages = [(0, (0, 13)), (1, (13, 26))], [(16, (0, 9)), (17, (9, 18)), (24, (18, 26))]
    plan = Plan(
        global_batch=64,
        seq_len=2048,
        model=PRESETS["gpt3-1.3b"],
        cluster=cluster,
        pipelines=[
            {
                "stages": [{"devices": [d], "layers": list(r)} for d, r in s],
                "micro_batch_size": 2,
                "num_micro_batches": m,
            }
            for s, m in zip(stages, (20, 12))
        ],
    ).validate_plan()
    cm = cost_model_for_plan(plan)
    agreement = compare_with_cost(plan, cm)
    assert abs(agreement.rel_diff) < 0.05
    res = simulate_plan(plan, cm)
    assert res.fits and 0 < res.bubble_fraction < 1
    assert all(0 < d.busy_fraction <= 1 for d in res.devices)


def test_each_pipeline_runs_its_own_schedule():
    # Pipeline 1 names GPipe, pipeline 0 keeps the plan's 1F1B: cost model and simulator both
    # give each its own in-flight count and pipeline time.
    both = simcases.plan([([(0, HALF), (1, REST)], 4), ([(2, HALF), (3, REST)], 4)])
    pipes = list(both.pipelines)
    pipes[1] = pipes[1].model_copy(update={"schedule": "gpipe"})
    mixed = both.model_copy(update={"pipelines": tuple(pipes)}).validate_plan()
    gpipe = simcases.plan([([(0, HALF), (1, REST)], 4), ([(2, HALF), (3, REST)], 4)], "gpipe")
    runs = {name: simulate_plan(p, simcases.cost_model(p)) for name, p in
            (("1f1b", both), ("mixed", mixed), ("gpipe", gpipe))}  # fmt: skip
    assert [d.max_in_flight for d in runs["mixed"].devices] == [2, 1, 4, 4]
    assert runs["mixed"].pipeline_time_s == (
        runs["1f1b"].pipeline_time_s[0],
        runs["gpipe"].pipeline_time_s[1],
    )
    est = step_cost(mixed, simcases.cost_model(mixed))
    assert est.pipeline_time_s[1] == step_cost(gpipe, simcases.cost_model(gpipe)).pipeline_time_s[1]


def test_sharded_plan_reduce_scatters_steps_then_all_gathers():
    # The plan of test_block_allreduce_waits_for_the_slower_pipeline with ZeRO-1: each bucket
    # reduce-scatters (half an all-reduce), every rank steps its shards, and the owners
    # all-gather the updated parameters in forward order, overlapped with the next step: a
    # program runs from the norm's barrier, the optimizer step and the all-gathers first, each
    # stage's first forward after a WAIT for its buckets' all-gathers; the closed form (an upper
    # bound, `cost.sync.overlapped_step_s`) agrees.
    base = simcases.plan([([(0, ALL)], 4), ([(2, HALF), (3, REST)], 4)])
    plan = base.model_copy(update={"sharding": "optimizer"})
    cm = simcases.cost_model(plan)
    programs, collectives = plan_programs(plan, cm)
    assert [
        [str(a) for a in p.actions if a.kind in ("SYNC", "OPT", "GATHER", "WAIT")] for p in programs
    ] == [
        ["0OPT", "0GATHER2", "0GATHER3", "0WAIT2", "0WAIT3", "0SYNC0", "0SYNC1", "0SYNC4"],
        ["0OPT", "0GATHER2", "0WAIT2", "0SYNC1", "0SYNC4"],
        ["1OPT", "1GATHER3", "1WAIT3", "1SYNC0", "1SYNC4"],
    ]
    assert [str(a) for a in programs[2].actions][:5] == [
        "1OPT",
        "1GATHER3",
        "1RECV_F0",
        "1WAIT3",
        "1F0",
    ]
    plain = plan_programs(base, cm)[1]
    assert [c.gather for c in collectives] == [False, False, True, True, False]
    for rs, ar in zip(collectives[:2], plain[:2]):  # the buckets
        assert rs.duration_s == pytest.approx(ar.duration_s / 2)  # P = 2, no latency here
    res = simulate_plan(plan, cm)
    tr = res.trace
    opt_end = {r: tr.end[(tr.rank == r) & (tr.kind == Kind.OPT)].max() for r in range(3)}
    for c in (2, 3):
        sel = (tr.kind == Kind.GATHER) & (tr.index == c)
        members = collectives[c].members
        assert tr.start[sel].min() >= max(opt_end[r] for r in members) - 1e-12
        first_f = [tr.start[(tr.rank == r) & (tr.kind == Kind.F)].min() for r in members]
        assert min(first_f) >= tr.end[sel].max() - 1e-12  # no forward before its parameters
    assert res.iteration_time_s == pytest.approx(tr.end[tr.kind == Kind.SYNC].max())
    closed = step_cost(plan, cm)
    assert res.iteration_time_s <= closed.iteration_time_s
    assert closed.iteration_time_s == pytest.approx(res.iteration_time_s, rel=1e-3)
    assert closed.exposed_sync_s == pytest.approx(res.exposed_sync_s, rel=1e-6)
    assert res.iteration_time_s != simulate_plan(base, cm).iteration_time_s
