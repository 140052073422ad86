"""`bench/imbalance.py`'s half-block granularity estimate."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_modules import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("imbalance")


def test_half_blocks_split_an_odd_block_count_over_two_equal_devices(bench):
    # whole blocks: 2 and 1; halves: 1 block + attention, MLP + 1 block
    assert bench.best_counts([1.0, 1.0], [0.0, 0.0], 3) == 2.0
    assert bench.half_block_counts([1.0, 1.0], 3, 0.5) == 1.5
    assert bench.half_block_counts([1.0, 1.0], 3, 0.4) == 1.6  # the MLP side is the larger


def test_a_slow_device_takes_a_half_only_where_it_ends_first(bench):
    assert bench.half_block_counts([4.0, 1.0], 1, 0.5) == 1.0  # the fast one takes it whole
    # two blocks, one device twice as fast: whole blocks give it both (2 s) or one each (2 s);
    # halves: the slow one takes an attention part (1 s), the fast one the rest (1.5 s)
    assert bench.best_counts([2.0, 1.0], [0.0, 0.0], 2) == 2.0
    assert bench.half_block_counts([2.0, 1.0], 2, 0.5) == 1.5


def test_attention_share_counts_the_projections_and_scores(bench):
    from hetpp.specs import load_model

    spec = load_model("gpt3-13b", 2048)
    h, s = spec.config.hidden_size, 2048
    want = (8.0 * h * h + 4 * s * h) / (8.0 * h * h + 4 * s * h + 16.0 * h * h)
    assert bench.attention_share(spec.config, s) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("model", ["gpt3-13b", "llama2-7b"])
def test_a_block_costs_the_same_on_either_layer_unit(bench, model):
    # a half-unit plan's granularity terms count whole blocks: its attention and MLP entries
    # together (the first entry alone is the attention half only)
    from hetpp.cost.compute import CostModel
    from hetpp.specs import TrainSpec, load_cluster, load_model

    spec = load_model(model, 2048)
    cluster = load_cluster(Path(__file__).parents[2] / "examples" / "a100-v100.yaml")
    train = TrainSpec(global_batch=8, seq_len=2048)
    got, first = [], []
    for s in (spec, spec.with_unit("half")):
        costs = CostModel(s, train, cluster).layer_costs(cluster.gpu(0), 1)
        got.append(bench.block_s(costs, [layer.kind for layer in s.layers]))
        first.append(float(costs.fwd_s[1] + costs.bwd_s[1]))
    assert got[0] == first[0]  # whole blocks: the first block's entry
    assert got[1] == pytest.approx(got[0], rel=1e-12)
    assert first[1] < 0.5 * got[1]  # the attention half alone is well under a block
