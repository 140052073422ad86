"""Optimizer sharding over block owners (ZeRO-1): memory, sync and step time by hand."""

import pytest

from hetpp.cost.comm import allreduce_time_s, group_link, ring_pass_time_s
from hetpp.cost.compute import CostModel
from hetpp.cost.memory import stage_memory
from hetpp.cost.params import stage_params, tied_copy_params
from hetpp.cost.step import cost_model_for_plan, device_optimizer_time_s, step_cost
from hetpp.planner import plan as run_planner
from hetpp.specs import CATALOG, PRESETS, Cluster, Plan, TrainSpec, load_model
from hetpp.specs.cluster import Link
from hetpp.specs.plan import grad_buckets
from tests.unit.planner_cases import cluster, problem, small_model


def test_ring_pass_is_half_an_allreduce():
    link = Link(100e9, 10e-6)
    # P = 4: each rank sends 3/4 of the bytes in 3 steps.
    assert ring_pass_time_s(4e9, 4, link) == pytest.approx(0.75 * 4e9 / 100e9 + 3 * 10e-6)
    assert 2 * ring_pass_time_s(4e9, 4, link) == pytest.approx(allreduce_time_s(4e9, 4, link))
    assert ring_pass_time_s(4e9, 1, link) == 0.0


def _one_node(gpu: str, n: int) -> Cluster:
    return Cluster(
        nodes=[{"gpu": gpu, "gpus_per_node": n, "intra_node_GBps": 100}], inter_node_GBps=10
    )


def test_sharded_stage_keeps_a_shard_of_master_and_adam_state():
    model = load_model("llama2-7b", 2048)
    train = TrainSpec(global_batch=8, seq_len=2048)
    costs = CostModel(model, train, _one_node("H200", 1)).layer_costs(CATALOG["h200"], 1)
    full = stage_memory(model, train, costs, 1, 9, 2, 2)
    half = stage_memory(model, train, costs, 1, 9, 2, 2, shards=3)
    n = stage_params(model, 1, 9)
    # bf16 weights (2) and fp32 grads (4) stay whole; fp32 master + m + v (12) split 3 ways.
    assert (half.weights, half.grads) == (full.weights, full.grads) == (2 * n, 4 * n)
    assert half.optimizer == pytest.approx(12 * n / 3)
    assert half.activations == full.activations


def test_tied_matrix_keeps_its_full_state():
    model = load_model("tiny-gpt", 64)  # tied embedding/head
    train = TrainSpec(global_batch=4, seq_len=64, precision="fp32")
    costs = CostModel(model, train, _one_node("A100-80GB", 1)).layer_costs(CATALOG["a100-80gb"], 1)
    tied = tied_copy_params(model)
    assert tied > 0
    last = len(model.layers)
    for a, b in ((0, 2), (2, last), (0, last)):
        n = stage_params(model, a, b)
        got = stage_memory(model, train, costs, a, b, 1, 1, shards=2).optimizer
        assert got == pytest.approx(8 * ((n - tied) / 2 + tied))  # fp32: m and v, 8 B
    n = stage_params(model, 2, 3)  # a middle block: no tied matrix
    assert stage_memory(model, train, costs, 2, 3, 1, 1, shards=2).optimizer == 8 * n / 2


def _two_pipelines(sharding: str) -> Plan:
    pipes = [
        {"stages": [{"devices": [0], "layers": [0, 3]}, {"devices": [1], "layers": [3, 6]}]},
        {"stages": [{"devices": [2], "layers": [0, 2]}, {"devices": [3], "layers": [2, 6]}]},
    ]
    return Plan(
        global_batch=8,
        seq_len=64,
        model=PRESETS["tiny-llama"],  # untied
        cluster=_one_node("A100-80GB", 4),
        sharding=sharding,
        pipelines=[{**p, "micro_batch_size": 1, "num_micro_batches": 4} for p in pipes],
    ).with_derived()


def test_sharded_sync_is_reduce_scatter_then_step_then_all_gather():
    plain, sharded = _two_pipelines("none"), _two_pipelines("optimizer")
    cm = cost_model_for_plan(plain)
    a, b = step_cost(plain, cm), step_cost(sharded, cm)
    assert sharded.optimizer_shards == 2 and plain.optimizer_shards == 1
    assert a.pipeline_time_s == b.pipeline_time_s
    assert a.gathers == ()
    buckets = grad_buckets(sharded)
    assert len(b.buckets) == len(b.gathers) == len(buckets) == 3
    # the all-gathers go in forward order (first layers first), the reverse of the sync's
    assert [g.blocks for g in b.gathers] == [x.blocks for x in reversed(b.buckets)]
    for x, y, g, bucket in zip(a.buckets, b.buckets, reversed(b.gathers), buckets):
        link = group_link(cm.cluster, bucket.owners)
        assert y.bytes == x.bytes  # gradients in bf16 (2 B) both ways
        assert y.end_s - y.start_s == pytest.approx(ring_pass_time_s(y.bytes, 2, link))
        assert x.end_s - x.start_s == pytest.approx(allreduce_time_s(x.bytes, 2, link))
        assert g.bytes == x.bytes / 2 * 2  # parameters in bf16 (2 B), gradients' count
        assert g.end_s - g.start_s == pytest.approx(ring_pass_time_s(g.bytes, 2, link))
    # Every stage steps half its parameters; the step ends with the last all-gather, after
    # each of its owners' optimizer steps.
    for st in b.stages:
        half = device_optimizer_time_s(cm, [st], 2)
        assert half == pytest.approx(device_optimizer_time_s(cm, [st]) / 2)
        assert st.memory.optimizer == pytest.approx(a.stages[st.device].memory.optimizer / 2)
    assert b.optimizer_s == pytest.approx(a.optimizer_s / 2)
    # The all-gathers overlap the next step's forward: each stage's first forward waits for
    # its device's optimizer step and its buckets' gathers (release, from the norm's end), and
    # the step is the norm's end plus the largest release past the stage's own first-forward
    # start (the forwards and hops before it): less than waiting for every all-gather.
    norm_end = max(b.pipeline_time_s) + b.exposed_sync_s
    opt = {st.device: device_optimizer_time_s(cm, [st], 2) for st in b.stages}
    delays = []
    for st in b.stages:
        mine = [g.end_s for g in b.gathers if st.device in g.owners]
        release = max([opt[st.device], *[t - norm_end for t in mine]])
        before = [x for x in b.stages if x.pipeline == st.pipeline and x.stage < st.stage]
        delays.append(release - sum(x.fwd_s + x.send_s for x in before))
    assert b.iteration_time_s == pytest.approx(norm_end + max(delays))
    assert max(delays) == delays[0] or max(delays) == delays[2]  # a first stage binds
    assert b.iteration_time_s < max(g.end_s for g in b.gathers)
    for g in b.gathers:
        stepped = [max(b.pipeline_time_s) for _ in g.owners]  # one node: sync ends early
        assert g.ready_s >= min(stepped)


def test_one_pipeline_sharding_changes_nothing():
    base = _two_pipelines("none")
    one = base.model_copy(
        update={
            "pipelines": base.pipelines[:1],
            "train": base.train.model_copy(update={"global_batch": 4}),
        }
    )
    cm = cost_model_for_plan(one)
    a = step_cost(one.with_derived(), cm)
    b = step_cost(one.model_copy(update={"sharding": "optimizer"}).with_derived(), cm)
    assert b.gathers == () and a.iteration_time_s == b.iteration_time_s


def test_planner_shards_a_plan_that_only_fits_sharded():
    # gpt3-2.7b: 18 B x 2.7 G = 48 GB of state does not fit one A100-40GB; sharded over two
    # data-parallel copies (2 + 4 + 12/2 = 12 B, 32 GB) it does, and at batch 8 beats one
    # 2-stage 1F1B pipeline (its bubble costs more than the all-gather; one-chunk schedules
    # only: a zero-bubble V would remove that bubble).
    cl = cluster(("A100-40GB", 2, 1))
    off = run_planner(problem(cl, "gpt3-2.7b", 8, sharding_mode="none", schedules=()))
    auto = run_planner(problem(cl, "gpt3-2.7b", 8, sharding_mode="auto", schedules=()))
    assert off.plan.sharding == "none" and len(off.plan.pipelines) == 1
    assert auto.plan.sharding == "optimizer" and len(auto.plan.pipelines) == 2
    assert auto.iteration_time_s < off.iteration_time_s
    unsharded = auto.plan.model_copy(update={"sharding": "none"})
    assert not step_cost(unsharded, cost_model_for_plan(unsharded)).fits
    assert step_cost(auto.plan, cost_model_for_plan(auto.plan)).iteration_time_s == (
        pytest.approx(auto.iteration_time_s)
    )


def test_half_precision_parameters_keep_half_gradients_and_fp32_masters_in_the_optimizer():
    # master_weights "optimizer": bf16 parameters (2) and gradients (2); the fp32 master + m + v
    # (12) are the optimizer's, split over the owners: 2 + 2 + 12/P.
    model = load_model("llama2-7b", 2048)
    train = TrainSpec(global_batch=8, seq_len=2048, master_weights="optimizer")
    assert train.half_params and train.state_bytes_per_param == 16
    costs = CostModel(model, train, _one_node("H200", 1)).layer_costs(CATALOG["h200"], 1)
    n = stage_params(model, 1, 9)
    for shards in (1, 2, 3):
        got = stage_memory(model, train, costs, 1, 9, 2, 2, shards=shards)
        assert (got.weights, got.grads) == (2 * n, 2 * n)
        assert got.optimizer == pytest.approx(12 * n / shards)
    # The embedding tables are parameters like any other (no autocast copy to leave out).
    first = stage_memory(model, train, costs, 0, 2, 2, 2, shards=2)
    assert first.weights == 2 * stage_params(model, 0, 2)
    autocast = stage_memory(model, TrainSpec(global_batch=8, seq_len=2048), costs, 0, 2, 2, 2)
    assert autocast.weights == 2 * stage_params(model, 1, 2)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"precision": "fp32"}, "needs precision bf16 or fp16"),
        ({"grad_bytes_per_param": 4}, "grad_bytes_per_param must be 2"),
    ],
)
def test_half_precision_parameters_need_half_precision(fields, expected):
    with pytest.raises(ValueError, match=expected):
        TrainSpec(global_batch=8, master_weights="optimizer", **fields)


def test_planner_shards_mixed_precision_with_masters_in_the_optimizer():
    # The sharded bf16 plan keeps half-precision parameters (what the runtime shards); its
    # state is 2 + 2 + 12/2 = 10 B per parameter, and what the plan records is what is costed.
    cl = cluster(("A100-40GB", 2, 1))
    auto = run_planner(problem(cl, "gpt3-2.7b", 8, sharding_mode="auto", schedules=()))
    assert auto.plan.sharding == "optimizer" and auto.plan.train.half_params
    assert step_cost(auto.plan, cost_model_for_plan(auto.plan)).iteration_time_s == (
        pytest.approx(auto.iteration_time_s)
    )
    model = load_model("gpt3-2.7b", 1024)
    tied = tied_copy_params(model)
    for st in auto.step.stages:  # one stage each, all layers: the tied matrix keeps its 12 B
        n = stage_params(model, 0, len(model.layers))
        assert st.memory.weights == st.memory.grads == 2 * n
        assert st.memory.optimizer == pytest.approx(12 * ((n - tied) / 2 + tied))


def test_auto_keeps_half_precision_parameters_where_only_they_fit():
    # 2.25 B parameters on one A100-40GB: 18 B each (fp32 parameters as masters) is 40 GB and
    # does not fit; 2 + 2 + 12 = 16 B (36 GB) does, unsharded (one device: nothing to shard).
    cl = cluster(("A100-40GB", 1, 1))
    model = small_model(28, 2560)
    assert 18 * model.total_params > 40e9 > 16 * model.total_params + 2e9
    off = run_planner(problem(cl, model, 8, sharding_mode="none", schedules=()))
    auto = run_planner(problem(cl, model, 8, sharding_mode="auto", schedules=()))
    assert not off.feasible
    assert auto.feasible and auto.plan.sharding == "none" and auto.plan.train.half_params


def test_auto_that_finds_nothing_says_which_sharded_searches_failed_too():
    # 3.1 B parameters on two A100-40GB: 16 B each unsharded (50 GB) and 2 + 2 + 12/2 = 10 B
    # sharded over two owners (31 GB per copy) both exceed one device, and a 2-stage pipeline
    # has only one owner per bucket. The reason names the unsharded state and then every
    # sharded search, so it does not read as if sharding had not been tried.
    cl = cluster(("A100-40GB", 1, 1))
    model = small_model(38, 2560)
    got = run_planner(problem(cl, model, 8, sharding_mode="auto", schedules=()))
    assert not got.feasible
    assert "with the optimizer state over 1 owner per bucket (2 + 2 + 12 B per parameter)" in (
        got.note
    )
    none = run_planner(problem(cl, model, 8, sharding_mode="none", schedules=()))
    assert "owner" not in none.note
