"""Tensor parallelism inside a stage: the cost rules of `hetpp.cost.tp`, by hand."""

from pathlib import Path

import pytest

from hetpp.cost.comm import allreduce_time_s, group_link
from hetpp.cost.compute import CostModel
from hetpp.cost.memory import stage_memory, stage_memory_parts
from hetpp.cost.step import cost_model_for_plan, step_cost
from hetpp.profile.estimator import estimate_layer
from hetpp.profile.table import ProfileRow, ProfileTable
from hetpp.sim import compare_with_cost, simulate_plan
from hetpp.specs import CATALOG, PRESETS, Cluster, Plan, TrainSpec, load_cluster, load_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
A100 = CATALOG["a100-80gb"]


def _node(n: int = 8) -> Cluster:
    return Cluster(
        nodes=[{"gpu": "A100-80GB", "gpus_per_node": n, "intra_node_GBps": 300}],
        inter_node_GBps=25,
    )


def test_a_tp_block_is_the_block_at_mbs_over_k_plus_two_allreduces_each_way():
    model = load_model("llama2-7b", 4096)
    cm = CostModel(model, TrainSpec(global_batch=8, seq_len=4096), _node())
    one, four = cm.layer_costs(A100, 4), cm.layer_costs(A100, 4, tp=4)
    link = group_link(cm.cluster, [0, 1, 2, 3])
    comm = 2 * allreduce_time_s(4 * 4096 * 4096 * 2, 4, link)  # b*s*h bf16, twice
    block = model.layers[1]
    f, b = estimate_layer(block, model, 1.0, A100)  # 4 samples over 4 ranks: the block at 1
    assert four.fwd_s[1] == pytest.approx(f + comm) and four.bwd_s[1] == pytest.approx(b + comm)
    # the embedding and the head run whole on every rank
    assert (four.fwd_s[0], four.fwd_s[-1]) == (one.fwd_s[0], one.fwd_s[-1])
    # 4-way TP of a 4-sample micro-batch beats one device, but by less than 4x
    assert one.fwd_s[1] / 4 < four.fwd_s[1] < one.fwd_s[1]


def test_a_measured_profile_is_asked_at_mbs_over_k_and_held_below_its_smallest_size():
    table = ProfileTable(
        tuple(
            ProfileRow("A100-80GB", "tiny-gpt", 64, "block", b, 0.01 * b, 0.02 * b, 100 * b)
            for b in (1, 2, 4)
        )
        + tuple(
            ProfileRow("A100-80GB", "tiny-gpt", 64, k, b, 0.001, 0.002, 10)
            for k in ("embedding", "head")
            for b in (1, 2, 4)
        )
    )
    model = load_model("tiny-gpt", 64)
    link_s = 2 * allreduce_time_s(4 * 64 * 64 * 2, 2, group_link(_node(), [0, 1]))
    cm = CostModel(model, TrainSpec(global_batch=8, seq_len=64), _node(), table)
    assert cm.layer_costs(A100, 4, tp=2).fwd_s[1] == pytest.approx(0.02 + link_s)
    link_s = 2 * allreduce_time_s(1 * 64 * 64 * 2, 2, group_link(_node(), [0, 1]))
    assert cm.layer_costs(A100, 1, tp=2).fwd_s[1] == pytest.approx(0.01 + link_s)  # held


def test_tp_memory_splits_block_states_and_part_of_the_activations():
    model = load_model("llama2-7b", 4096)
    train = TrainSpec(global_batch=8, seq_len=4096)
    cm = CostModel(model, train, _node())
    one, two = cm.layer_costs(A100, 1), cm.layer_costs(A100, 1, tp=2)
    m1, m2 = (stage_memory(model, train, c, 1, 9, 3, 8) for c in (one, two))
    h, f, s = 4096, 11008, 4096
    norms = 8 * 2 * h  # 8 blocks x 2 RMSNorm weights, whole on every TP rank
    assert m2.weights == (m1.weights / train.dtype_bytes + norms) / 2 * train.dtype_bytes
    assert m2.optimizer == m1.optimizer / 2 + norms / 2 * train.optimizer_bytes_per_param
    whole, split = 8 * h, 6 * h + 4 * f  # norms' in/out and fp32 upcasts stay whole
    assert two.saved_bytes[1] == pytest.approx(s * 2 * (whole + split / 2))
    assert one.saved_bytes[1] == s * 2 * (whole + split)
    # the embedding keeps its whole table on every rank
    e1, e2 = (stage_memory(model, train, c, 0, 1, 1, 8) for c in (one, two))
    assert e1.weights == e2.weights
    parts = stage_memory_parts(model, train, two)
    buffers = parts.per_activation_buffer[1, 9] + parts.per_gradient_buffer[1, 9]
    total = parts.fixed[1, 9] + 3 * parts.per_in_flight[1, 9] + 8 * buffers
    assert total == pytest.approx(m2.total)


def _tp_plan(tp_devices: list[list[int]], model: str = "gpt3-1.3b") -> Plan:
    cluster = load_cluster(EXAMPLES / "a100-v100.yaml")
    return Plan(
        global_batch=32,
        seq_len=2048,
        model=PRESETS[model],
        cluster=cluster,
        pipelines=[
            {
                "stages": [
                    {"devices": tp_devices[0], "layers": [0, 13]},
                    {"devices": tp_devices[1], "layers": [13, 26]},
                ],
                "micro_batch_size": 2,
                "num_micro_batches": 8,
            },
            {
                "stages": [
                    {"devices": tp_devices[2], "layers": [0, 13]},
                    {"devices": tp_devices[3], "layers": [13, 26]},
                ],
                "micro_batch_size": 2,
                "num_micro_batches": 8,
            },
        ],
    ).validate_plan()


def test_tp_bucket_syncs_the_least_degrees_share_and_the_simulator_agrees():
    # A100 pipeline with TP-2 stages next to a V100 pipeline without TP (devices 16.. are V100)
    plan = _tp_plan([[0, 1], [2, 3], [16], [17]])
    cm = cost_model_for_plan(plan)
    step = step_cost(plan, cm)
    plain = step_cost(_tp_plan([[0], [2], [16], [17]]), cm)
    # the V100 owners hold whole blocks: every bucket is as large as without TP
    assert [b.bytes for b in step.buckets] == [b.bytes for b in plain.buckets]
    both = step_cost(_tp_plan([[0, 1], [2, 3], [8, 9], [10, 11]]), cm)
    layers = cm.model.layers
    *blocks, tied = both.buckets  # the tied embedding/head copy stays whole on every rank
    assert tied.bytes == plain.buckets[-1].bytes
    for b in blocks:  # each rank syncs half of every block but its norms; the embedding/head whole
        ((lo, hi),) = b.blocks
        whole = sum(x.params for x in layers[lo:hi] if x.kind != "block")
        whole += sum(x.params_whole_under_tp for x in layers[lo:hi])
        half = (
            sum(x.params - x.params_whole_under_tp for x in layers[lo:hi] if x.kind == "block") / 2
        )
        assert b.bytes == pytest.approx((whole + half) * plan.train.grad_bytes_per_param)
    assert step.stages[0].memory.weights < 0.6 * plain.stages[0].memory.weights
    assert step.stages[0].fwd_s < plain.stages[0].fwd_s
    agreement = compare_with_cost(plan, cm)
    assert abs(agreement.rel_diff) < 0.05
    res = simulate_plan(plan, cm)
    assert res.iteration_time_s == pytest.approx(agreement.simulated_s)
    assert [d.device for d in res.devices] == [0, 2, 16, 17]  # one timeline per stage
