"""ZeRO-1 over block owners on forked gloo ranks: each bucket reduce-scattered, its optimizer
state split over its owners, the parameters all-gathered; equal to single-process training.

Bucket sizes of the tiny models do not divide by their 2 or 3 owners, so the last shards end in
padding (`tests/unit/test_runtime_shard.py` checks the layout)."""

from __future__ import annotations

import pytest
import torch
from disthelpers import checkpoint_layers, make_plan, pipeline, three_pipes_3_2_1, train, two_pipes_3_2

from hetpp.report.memory import memory_rows
from hetpp.runtime import checkpoint
from hetpp.runtime.metrics import load_records
from hetpp.specs.plan import grad_buckets

pytestmark = pytest.mark.dist

CASES = {
    # 2 owners per bucket; untied; weight decay on matrices only; clipping scales the shards.
    "llama-2pipes-3+2-clip-decay": (
        "tiny-llama",
        two_pipes_3_2(),
        "1f1b",
        {"clip_grad": 0.05, "weight_decay": 0.1},
    ),
    # 3 owners per bucket, three shapes; tied embedding/head (kept whole, its own all-reduce).
    "gpt-3pipes-3+2+1-gpipe-clip-decay": (
        "tiny-gpt",
        three_pipes_3_2_1(),
        "gpipe",
        {"clip_grad": 0.05, "weight_decay": 0.1},
    ),
    # The all-gathers overlap the next forward (`ShardedStep`): a V over three devices whose
    # later chunks read their buckets late, recomputing some stages (the hooks run again),
    # beside interleaved 1F1B; validation between steps reads the parameters too.
    "gpt-2pipes-zbv3x2-recompute+interleaved2x2-clip-decay-eval": (
        "tiny-gpt",
        [
            pipeline([0, 1, 2, 2, 1, 0], [0, 1, 2, 3, 4, 5, 6], 1, 6, "rnrr--", schedule="zbv"),
            pipeline([3, 4, 3, 4], [0, 2, 3, 4, 6], 1, 4, schedule="interleaved-1f1b"),
        ],
        "zbv",
        {"clip_grad": 0.05, "weight_decay": 0.1, "eval_every": 2, "eval_batches": 1},
    ),
    # One-stage pipelines of a tied model: the tied weight is every rank's, outside the
    # buckets; SGD keeps no state to shard.
    "gpt-2pipes-1+1-sgd-clip": (
        "tiny-gpt",
        [pipeline([0], [0, 6], 2, 2), pipeline([1], [0, 6], 1, 3)],
        "1f1b",
        {"clip_grad": 0.05, "optimizer": "sgd", "lr": 0.1},
    ),
}


def _sharded(model, pipes, schedule, masters="params"):
    """fp32, or with `masters` "optimizer" bf16 with half-precision parameters and fp32 masters
    in the optimizer (`tests/dist/test_dist_half_params.py`)."""
    if masters == "params":
        return make_plan(model, pipes, schedule).model_copy(update={"sharding": "optimizer"})
    plan = make_plan(model, pipes, schedule, precision="bf16")
    train = plan.train.model_copy(update={"master_weights": masters})
    return plan.model_copy(update={"sharding": "optimizer", "train": train})


@pytest.mark.parametrize("case", list(CASES))
def test_sharded_training_matches_single_process(case, tmp_path):
    model, pipes, schedule, opts = CASES[case]
    plan = _sharded(model, pipes, schedule)
    assert plan.optimizer_shards == len(pipes)
    results = train(plan, tmp_path, steps=3, verify=True, fp64=True, **opts)
    report = results[0].verify
    assert report is not None and report.tolerance == 1e-10
    assert report.max_param_diff <= 1e-10, report
    assert report.max_loss_diff <= 1e-10, report
    assert all(r.grad_norm > opts["clip_grad"] for r in results[0].records)


def _max_diff(a: list[dict], b: list[dict]) -> float:
    diff = 0.0
    for x, y in zip(a, b):
        assert x["params"].keys() == y["params"].keys() and x["optim"].keys() == y["optim"].keys()
        for n in x["params"]:
            assert x["params"][n].dtype == y["params"][n].dtype
            diff = max(diff, float((x["params"][n] - y["params"][n]).abs().max()))
            for k, v in x["optim"][n].items():
                assert v.shape == y["optim"][n][k].shape  # whole parameters, not shards
                diff = max(diff, float((v - y["optim"][n][k]).abs().max()))
    return diff


@pytest.mark.parametrize("masters", ["params", "optimizer"])
def test_sharded_checkpoint_is_whole_and_resumes(tmp_path, masters):
    """fp32, and half-precision parameters with fp32 masters (their files hold the whole
    masters in the parameters' place); run in float64 either way."""
    model, pipes, schedule, _ = CASES["gpt-3pipes-3+2+1-gpipe-clip-decay"]
    plan = _sharded(model, pipes, schedule, masters)
    opts = {"fp64": True, "weight_decay": 0.1, "lr_schedule": "cosine", "decay_steps": 4}
    sharded_ckpt, plain_ckpt = tmp_path / "sharded", tmp_path / "plain"
    first = train(plan, tmp_path, steps=2, checkpoint_dir=str(sharded_ckpt), **opts)
    plain = plan.model_copy(update={"sharding": "none"})
    train(plain, tmp_path, steps=2, checkpoint_dir=str(plain_ckpt), **opts)
    # Gathered on save: the same whole-parameter files an unsharded run writes.
    a, b = checkpoint.latest(sharded_ckpt), checkpoint.latest(plain_ckpt)
    assert _max_diff(checkpoint_layers(a), checkpoint_layers(b)) <= 1e-10
    assert all(checkpoint_layers(a)[i]["optim"] for i in range(6))  # moments were written
    # Resumed sharded (each owner takes its slice), checked against a single process from the
    # checkpoint, and equal to an uninterrupted sharded run.
    resumed = train(
        plan, tmp_path, steps=4, checkpoint_dir=str(sharded_ckpt), resume=True, verify=True, **opts
    )
    assert [r.step for r in resumed[0].records] == [3, 4]
    assert resumed[0].verify is not None and resumed[0].verify.ok, resumed[0].verify
    whole = train(plan, tmp_path, steps=4, **opts)
    losses = [r.loss for r in first[0].records + resumed[0].records]
    assert losses == pytest.approx([r.loss for r in whole[0].records], abs=1e-10, rel=0)


def test_sharded_ranks_hold_the_predicted_state(tmp_path):
    """`--memory-report`: each rank keeps 4 + 4 + 8/P bytes per parameter (fp32 AdamW) but for
    the tied matrix, what the cost model charges (up to the shards' padding), and less than
    unsharded."""
    model, pipes, schedule, _ = CASES["gpt-3pipes-3+2+1-gpipe-clip-decay"]
    rows = {}
    for sharding in ("none", "optimizer"):
        plan = _sharded(model, pipes, schedule).model_copy(update={"sharding": sharding})
        metrics = tmp_path / f"m-{sharding}.jsonl"
        train(plan, tmp_path, steps=2, memory_report=True, metrics=str(metrics))
        rows[sharding] = memory_rows(plan, load_records(metrics, "memory"))
    # The model charges N/P elements of each bucket; an owner's shard holds up to ceil(N/P):
    # at most one element's m and v (8 B) more per bucket.
    slack = 8 * len(grad_buckets(plan))
    for a, b in zip(rows["none"], rows["optimizer"]):
        assert abs(b["measured_states_bytes"] - b["predicted_states_bytes"]) <= slack, b
        assert b["measured_states_bytes"] < a["measured_states_bytes"]
        assert a["measured_states_bytes"] == a["predicted_states_bytes"], a
