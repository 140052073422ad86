"""Half-precision parameters with fp32 masters in the optimizer (`train.master_weights`
"optimizer"), sharded over block owners (ZeRO-1) or not, on forked gloo ranks.

Exactness runs the same code path in float64 (`--fp64`: float64 parameters, float64 masters)
against single-process training that steps its float64 parameters directly (the reference makes
no masters when they would have the parameters' dtype, so a fault in `MasterWeights` shows);
the bf16 run is compared with a single process doing the same mixed precision (bf16 parameters
and gradients, fp32 masters). Sharded fp64 checkpoints of half-precision parameters:
`tests/dist/test_dist_sharding.py` (its checkpoint test runs both ways). Bucket sizes of the tiny models
do not divide by their 2 or 3 owners, so the last shards end in padding."""

from __future__ import annotations

import pytest
import torch
from disthelpers import checkpoint_layers, make_plan, pipeline, three_pipes_3_2_1, train, two_pipes_3_2

from hetpp.runtime import checkpoint

pytestmark = pytest.mark.dist

CASES = {
    # Sharded over 2 owners; untied; weight decay on matrices only; clipping on the masters.
    "llama-2pipes-3+2-sharded": (
        "tiny-llama",
        two_pipes_3_2(),
        "optimizer",
    ),
    # Sharded over 3 owners, three shapes; tied embedding/head (whole, its own all-reduce).
    "gpt-3pipes-3+2+1-sharded": (
        "tiny-gpt",
        three_pipes_3_2_1(),
        "optimizer",
    ),
    # Unsharded: a whole fp32 master per parameter on every rank.
    "llama-2pipes-2+1-unsharded": (
        "tiny-llama",
        [pipeline([0, 1], [0, 3, 6], 1, 4), pipeline([2], [0, 6], 2, 2)],
        "none",
    ),
}
OPTS = {"clip_grad": 0.05, "weight_decay": 0.1}


def _half(model, pipes, sharding, precision="bf16"):
    plan = make_plan(model, pipes, precision=precision)
    train_spec = plan.train.model_copy(update={"master_weights": "optimizer"})
    return plan.model_copy(update={"sharding": sharding, "train": train_spec})


@pytest.mark.parametrize("case", list(CASES))
def test_fp64_bookkeeping_matches_single_process(case, tmp_path):
    model, pipes, sharding = CASES[case]
    plan = _half(model, pipes, sharding)
    assert plan.train.half_params and plan.optimizer_shards == (
        len(pipes) if sharding == "optimizer" else 1
    )
    results = train(plan, tmp_path, steps=3, verify=True, fp64=True, **OPTS)
    report = results[0].verify
    assert report is not None and report.tolerance == 1e-10
    assert report.max_param_diff <= 1e-10, report
    assert report.max_loss_diff <= 1e-10, report
    assert all(r.grad_norm > OPTS["clip_grad"] for r in results[0].records)  # clipping acted


BF16_TOL = 2.0**-8
"""One bf16 rounding step (half an ulp at 1, a full one below) of the parameters, whose
magnitudes here are at most 1 (norm weights) and mostly below 0.1: what the pipelined run and
the reference may differ by where an fp32 sum (the gradient norm, AdamW's arithmetic) rounds a
master across a bf16 rounding boundary. Measured on the 2-core AVX2 build machine, 3 steps:
0 (bit-identical parameters and losses), sharded and unsharded: the micro-batch gradients are
the same kernels' results, and a sum of two bf16 values rounds alike in gloo and in torch."""


def test_bf16_run_matches_a_single_process_doing_the_same_mixed_precision(tmp_path):
    model, pipes, _ = CASES["llama-2pipes-3+2-sharded"]
    plan = _half(model, pipes, "optimizer")
    results = train(plan, tmp_path, steps=3, verify=True, verify_tol=BF16_TOL, **OPTS)
    report = results[0].verify
    assert report is not None and report.ok, report
    assert all(r.grad_norm > OPTS["clip_grad"] for r in results[0].records)


def test_bf16_checkpoint_stores_the_fp32_masters(tmp_path):
    """A bf16 run's files hold float32 parameters: the masters, which the bf16 parameters are
    rounded from; resuming takes them back (the masters are not re-made from bf16)."""
    model, pipes, _ = CASES["llama-2pipes-3+2-sharded"]
    plan = _half(model, pipes, "optimizer")
    ckpt = tmp_path / "ckpt"
    train(plan, tmp_path, steps=2, checkpoint_dir=str(ckpt), **OPTS)
    layers = checkpoint_layers(checkpoint.latest(ckpt))
    values = [t for x in layers for t in x["params"].values()]
    assert all(t.dtype == torch.float32 for t in values)
    # Some master is not a bf16 value (an update below the bf16 spacing was kept).
    assert any(not torch.equal(t, t.bfloat16().float()) for t in values)
    resumed = train(
        plan, tmp_path, steps=3, checkpoint_dir=str(ckpt), resume=True, verify=True,
        verify_tol=BF16_TOL, **OPTS,
    )  # fmt: skip
    assert resumed[0].verify is not None and resumed[0].verify.ok, resumed[0].verify
