"""Fully sharded plans (FSDP2 on gloo) with unequal batch shares equal single-process training."""

from __future__ import annotations

import pytest
from disthelpers import make_plan, pipeline, train

from hetpp.specs import Plan

pytestmark = pytest.mark.dist


def fsdp_plan(model: str, sizes: list[int], m: int, recompute: str = "", **kw) -> Plan:
    """One whole-model pipeline per rank, rank r with micro-batch size sizes[r], m micro-batches."""
    pipes = [
        pipeline([d], [0, 6], b, m, recompute=recompute[d : d + 1]) for d, b in enumerate(sizes)
    ]
    plan = make_plan(model, pipes, **kw)
    return plan.model_copy(update={"sharding": "full"}).validate_plan()


CASES = {
    # tiny-gpt ties embedding and head (one parameter in the root unit)
    "gpt-3ranks-3/2/1x2-clip": (fsdp_plan("tiny-gpt", [3, 2, 1], 2), {"clip_grad": 0.05}),
    "llama-2ranks-3/1x1-recompute-one": (fsdp_plan("tiny-llama", [3, 1], 1, recompute="r-"), {}),
    "llama-3ranks-1/2/1x3-sgd-clip": (
        fsdp_plan("tiny-llama", [1, 2, 1], 3),
        {"optimizer": "sgd", "lr": 0.1, "clip_grad": 0.05},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fsdp_matches_single_process_fp64(case, tmp_path):
    plan, opts = CASES[case]
    results = train(plan, tmp_path, steps=3, verify=True, fp64=True, **opts)
    report = results[0].verify
    assert report is not None and report.tolerance == 1e-10
    assert report.max_param_diff <= 1e-10, report
    assert report.max_loss_diff <= 1e-10, report
    assert [r.step for r in results[0].records] == [1, 2, 3]
    if "clip_grad" in opts:  # clipping really scaled the gradients
        assert all(r.grad_norm > opts["clip_grad"] for r in results[0].records)


def test_fsdp_checkpoint_resumes_under_fsdp_and_under_pipelines(tmp_path):
    """Checkpoints gather to the plan-independent format: FSDP (3 ranks) -> FSDP (2 ranks, other
    shares) -> a pipelined plan, each resumed part checked by --verify against the reference
    resumed from the same checkpoint, and the losses against an uninterrupted FSDP run."""
    fsdp_a = fsdp_plan("tiny-gpt", [2, 1, 1], 2)
    fsdp_b = fsdp_plan("tiny-gpt", [3, 1], 2)
    piped = make_plan("tiny-gpt", [pipeline([0, 1], [0, 3, 6], 2, 4)])
    opts = {"fp64": True, "clip_grad": 0.05}
    ckpt = str(tmp_path / "ckpt")
    first = train(fsdp_a, tmp_path, steps=2, checkpoint_dir=ckpt, **opts)
    second = train(fsdp_b, tmp_path, steps=4, checkpoint_dir=ckpt, resume=True, verify=True, **opts)
    third = train(piped, tmp_path, steps=5, checkpoint_dir=ckpt, resume=True, verify=True, **opts)
    whole = train(fsdp_a, tmp_path, steps=5, **opts)
    for part in (second, third):
        assert part[0].verify is not None and part[0].verify.ok, part[0].verify
    losses = [r.loss for part in (first, second, third) for r in part[0].records]
    assert [r.step for part in (first, second, third) for r in part[0].records] == [1, 2, 3, 4, 5]
    assert losses == pytest.approx([r.loss for r in whole[0].records], abs=1e-10, rel=0)


def test_fsdp_bf16_mixed_precision_verifies(tmp_path):
    """bf16: FSDP2's MixedPrecisionPolicy against the autocast reference, at bf16's tolerance."""
    plan = fsdp_plan("tiny-llama", [3, 1], 2, precision="bf16")
    results = train(plan, tmp_path, steps=3, verify=True, clip_grad=0.05)
    report = results[0].verify
    assert report is not None and report.ok, report
