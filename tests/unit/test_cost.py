"""Cost model against hand computations."""

from pathlib import Path

import pytest

from hetpp.cost.comm import allreduce_time_s, group_link, p2p_link, p2p_time_s
from hetpp.cost.compute import CostModel
from hetpp.cost.memory import recv_buffer_counts, stage_memory
from hetpp.cost.params import stage_params
from hetpp.cost.pipeline import backward_done_s, pipeline_time_s
from hetpp.cost.step import cost_model_for_plan, step_cost
from hetpp.profile.table import ProfileRow, ProfileTable
from hetpp.specs import CATALOG, PRESETS, Cluster, Plan, TrainSpec, load_cluster, load_model
from hetpp.specs.cluster import Link
from hetpp.specs.schedule import SCHEDULES


def test_llama2_7b_one_stage_memory_by_hand():
    model = load_model("llama2-7b", 2048)
    # bf16 working weights (2 B), fp32 gradients as the runtime keeps them (4 B, though they are
    # all-reduced in bf16), fp32 master + Adam m and v (12 B).
    train = TrainSpec(global_batch=8, seq_len=2048)
    cm = CostModel(model, train, _one_node("H200", 1))
    costs = cm.layer_costs(CATALOG["h200"], 1)
    mem = stage_memory(model, train, costs, 0, 34, SCHEDULES["1f1b"].in_flight(0, 1, 8), 8)
    n = 6_738_415_616
    tables = 32000 * 4096  # the embedding lookup reads the float32 table: no bf16 copy
    assert (mem.weights, mem.grads, mem.optimizer) == (2 * (n - tables), 4 * n, 12 * n)
    h, f, s = 4096, 11008, 2048
    # Per block, saved elements per token: norm in/out x2 (4h), q,k,v (3h), attention out (h),
    # rotated q,k (2h), fp32 norm upcasts (2 x 2h), SwiGLU gate, up, act, product (4f); bf16.
    block = s * (14 * h + 4 * f) * 2
    # Final norm in/out, its fp32 upcast, the bf16 logits (torch's stage keeps them) and the
    # loss's fp32 log-probabilities.
    head = s * (2 * h + 32000) * 2 + s * h * 4 + s * 32000 * 4
    emb = s * 8  # token ids
    assert mem.activations == 32 * block + head + emb
    # One stage: nothing received, nothing sent back.
    assert (mem.recv_buffers, mem.transient, mem.reserve) == (0, 0, 2e9)
    print(
        f"llama2-7b, one stage, mbs 1, seq 2048: {mem.total / 1e9:.1f} GB "
        f"(states {18 * n / 1e9:.1f} GB, activations {mem.activations / 1e9:.2f} GB)"
    )
    assert mem.total > CATALOG["a100-80gb"].memory_bytes  # does not fit one A100-80GB
    assert mem.total < CATALOG["h200"].memory_bytes


def test_recomputation_keeps_only_layer_inputs():
    model = load_model("gpt3-1.3b", 2048)
    train = TrainSpec(global_batch=8, recompute=True)
    costs = CostModel(model, train, _one_node("A100-80GB", 1)).layer_costs(CATALOG["a100-80gb"], 2)
    mem = stage_memory(model, train, costs, 1, 5, 3, 8)
    s, h = 2048, 2048
    act = 2 * s * h * 2  # one micro-batch's activation between blocks (mbs 2, bf16)
    # Per in-flight micro-batch: the 4 blocks' inputs, less the first (a receive buffer), plus
    # the stage's output, which torch's stage keeps until the backward.
    assert mem.activations == 3 * (4 * act - act + act)
    # A receive buffer for the input and one for the output's gradient, per micro-batch of the step.
    assert mem.recv_buffers == 8 * 2 * act
    # One block's full activations during its backward; two input gradients on their way back.
    assert mem.transient == s * 32 * h * 2 + 2 * act
    plain = CostModel(model, TrainSpec(global_batch=8), _one_node("A100-80GB", 1))
    assert costs.bwd(1, 5) == pytest.approx(
        plain.layer_costs(CATALOG["a100-80gb"], 2).bwd(1, 5) + costs.fwd(1, 5)
    )


def test_in_flight_and_fewest_micro_batches_1f1b_and_gpipe():
    one, gpipe = SCHEDULES["1f1b"], SCHEDULES["gpipe"]
    assert [one.in_flight(s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert one.in_flight(0, 4, 2) == 2
    assert gpipe.in_flight(3, 4, 8) == 8
    assert (one.min_micro_batches(4), gpipe.min_micro_batches(4)) == (4, 1)


def test_zbh1_holds_as_many_micro_batches_as_stages_on_every_stage():
    # torch's ZB1P at one chunk: rank r warms up with S - r - 1 forwards like 1F1B, then defers
    # its Ws by r micro-batches, and a micro-batch is held until its W: S on every stage (1F1B:
    # S - s). Its receive buffers are torch's lowered IR's, not 1F1B's one per in-flight.
    spec = SCHEDULES["zbh1"]
    assert [spec.in_flight(s, 4, 8) for s in range(4)] == [4, 4, 4, 4]
    assert [spec.in_flight(s, 4, 3) for s in range(4)] == [3, 3, 3, 3]
    assert [recv_buffer_counts(spec, 4, 8, s, 4, 4) for s in range(4)] == [
        (0, 1), (5, 2), (5, 3), (5, 0)
    ]  # fmt: skip


def test_tied_head_stores_a_copy_unless_with_embedding():
    m = load_model("gpt3-1.3b", 2048)
    vh = 50304 * 2048  # the padded vocabulary's matrix
    assert stage_params(m, 20, 26) == sum(x.params for x in m.layers[20:26]) + vh
    assert stage_params(m, 0, 26) == m.built_params


def test_comm_formulas():
    link = Link(10e9, 1e-5)
    assert p2p_time_s(1e9, link) == pytest.approx(0.1 + 1e-5)
    assert allreduce_time_s(1e9, 4, link) == pytest.approx(2 * 3 / 4 * 0.1 + 6e-5)
    assert allreduce_time_s(1e9, 1, link) == 0.0


def test_pipeline_closed_form_1f1b():
    # 2 stages, f=(1,2), b=(2,4), comm 0.5, m=4: fill 1+2+2+4+2*0.5 = 10, then 3 x max(3,6).
    assert pipeline_time_s([1, 2], [2, 4], [0.5], 4) == 10 + 3 * 6
    assert pipeline_time_s([1, 2], [2, 4], [0.5], 4, "gpipe") == 10 + 3 * (2 + 4)
    assert backward_done_s([2, 4], [0.5], 28) == [28, 25.5]


def _one_node(gpu: str, n: int) -> Cluster:
    return Cluster(
        nodes=[{"gpu": gpu, "gpus_per_node": n, "intra_node_GBps": 100}], inter_node_GBps=10
    )


def test_measured_profile_takes_precedence(small_cluster):
    rows = [
        ProfileRow("A100-80GB", "tiny-gpt", 64, k, 1, 0.01, 0.02, 1000)
        for k in ("embedding", "block", "head")
    ]
    plan = Plan(
        global_batch=4,
        seq_len=64,
        model=PRESETS["tiny-gpt"],
        cluster=small_cluster,
        pipelines=[
            {
                "stages": [{"devices": [0], "layers": [0, 3]}, {"devices": [1], "layers": [3, 6]}],
                "micro_batch_size": 1,
                "num_micro_batches": 4,
            }
        ],
    )
    step = step_cost(plan, cost_model_for_plan(plan, ProfileTable(rows)))
    assert [s.fwd_s for s in step.stages] == pytest.approx([0.03, 0.03])
    assert [s.bwd_s for s in step.stages] == pytest.approx([0.06, 0.06])
    comm = 64 * 64 * 2 / 300e9 + 5e-6
    # 1F1B beat: the two stages' round trip (0.18 + 2 comm) holds 2 micro-batches (beat_s).
    assert step.pipeline_time_s[0] == pytest.approx(0.18 + 2 * comm + 3 * (0.09 + comm))


def test_two_pipelines_sync_waits_for_the_slower(small_cluster):
    plan = Plan(
        global_batch=8,
        seq_len=64,
        model=PRESETS["tiny-llama"],
        cluster=small_cluster,
        pipelines=[
            {
                "stages": [{"devices": [0], "layers": [0, 6]}],
                "micro_batch_size": 1,
                "num_micro_batches": 4,
            },
            {
                "stages": [{"devices": [2], "layers": [0, 6]}],
                "micro_batch_size": 1,
                "num_micro_batches": 4,
            },
        ],
    )
    step = step_cost(plan, cost_model_for_plan(plan))
    (bucket,) = step.buckets
    assert bucket.owners == (0, 2) and bucket.ready_s == max(step.pipeline_time_s)
    assert step.iteration_time_s >= bucket.end_s
    assert step.throughput_samples_per_s == pytest.approx(8 / step.iteration_time_s)


def test_fp32_training_keeps_fp32_grads_and_no_master_copy():
    # AdamW in fp32: weights 4 + grads 4 + m 4 + v 4 bytes; what `hetpp train` runs today.
    t = TrainSpec(global_batch=8, precision="fp32")
    assert (t.dtype_bytes, t.grad_bytes_per_param, t.optimizer_bytes_per_param) == (4, 4, 8.0)
    assert t.state_bytes_per_param == 16
    # bf16 mixed precision: bf16 weight copies 2 + fp32 grads 4 (the runtime accumulates in fp32
    # whatever the all-reduce sends) + fp32 master, m and v 12.
    assert TrainSpec(global_batch=8).state_bytes_per_param == 18
    assert (
        TrainSpec(global_batch=8, precision="fp32", grad_bytes_per_param=2).grad_bytes_per_param
        == 2
    )


def test_links_intra_and_inter_node():
    c = load_cluster(Path(__file__).parents[2] / "examples" / "a100-v100.yaml")
    assert p2p_link(c, 0, 7).bw_bytes_per_s == 300e9
    assert p2p_link(c, 16, 17).bw_bytes_per_s == 150e9
    assert p2p_link(c, 7, 8).bw_bytes_per_s == 12.5e9
    assert p2p_link(c, 7, 8).latency_s == pytest.approx(10e-6)
    # A ring that leaves a node runs at the slower of network and node fabric.
    assert group_link(c, [0, 16]).bw_bytes_per_s == 12.5e9
    assert group_link(c, [16, 17, 18]).bw_bytes_per_s == 150e9
