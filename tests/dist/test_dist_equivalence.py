"""Pipelined training on forked gloo ranks equals single-process training of the full batch.

Each case runs 3 steps with --verify: rank 0 gathers every copy of every parameter (all pipelines,
tied copies included), trains the same steps in one process and reports the largest differences.
"""

from __future__ import annotations

import pytest
from disthelpers import make_plan, pipeline, train, two_pipes_3_2

from hetpp.runtime.options import DEFAULT_VERIFY_TOL

pytestmark = pytest.mark.dist

# tiny-gpt and tiny-llama: 6 layers (embedding, 4 blocks, head). tiny-gpt ties embedding and head.
# Plans are fp32 unless the options say `precision`; `fp64` runs an fp32 plan in float64.
CASES = {
    # name: (model, pipelines, schedule, options)
    "gpt-1pipe-1stage": (
        "tiny-gpt",
        [pipeline([0], [0, 6], 2, 3)],
        "1f1b",
        {"fp64": True},
    ),
    "gpt-2pipes-2+1-unequal-clip": (
        "tiny-gpt",
        [pipeline([0, 1], [0, 2, 6], 2, 5), pipeline([2], [0, 6], 3, 2)],
        "1f1b",
        {"fp64": True, "clip_grad": 0.05},
    ),
    "gpt-3pipes-4+2+1-gpipe-sgd": (
        "tiny-gpt",
        [
            pipeline([0, 1, 5, 4], [0, 1, 3, 5, 6], 1, 8),
            pipeline([3, 6], [0, 4, 6], 2, 2),
            pipeline([2], [0, 6], 4, 1),
        ],
        "gpipe",
        {"fp64": True, "optimizer": "sgd", "lr": 0.1},
    ),
    "llama-2pipes-3+2-clip": (
        "tiny-llama",
        two_pipes_3_2(),
        "1f1b",
        {"fp64": True, "clip_grad": 0.05},
    ),
    "llama-3pipes-1+3+2-gpipe-fp32": (
        "tiny-llama",
        [
            pipeline([0], [0, 6], 2, 2),
            pipeline([1, 2, 3], [0, 1, 5, 6], 2, 3),
            pipeline([4, 5], [0, 2, 6], 1, 2),
        ],
        # fp32 AdamW at its default lr: the reference mirrors the micro-batches, so AdamW's
        # lr/eps amplification of near-zero gradient entries finds no rounding to amplify.
        "gpipe",
        {},
    ),
    "gpt-2pipes-4+3-fp32-sgd-clip-recompute": (
        "tiny-gpt",
        [
            pipeline([0, 1, 2, 3], [0, 2, 3, 4, 6], 1, 6, recompute="rnrr"),
            pipeline([4, 5, 6], [0, 1, 4, 6], 2, 3, recompute="nrn"),
        ],
        "1f1b",
        {"optimizer": "sgd", "lr": 0.1, "clip_grad": 0.05},
    ),
    # Recomputation on some stages and not others (r: on, n: off), emulated: devices 4-7 are
    # V100s, which run slower (`slow_gpu`).
    "llama-3pipes-2+1+2-bf16-clip-recompute-emulated": (
        "tiny-llama",
        [
            pipeline([0, 1], [0, 3, 6], 1, 4, recompute="rn"),
            pipeline([2], [0, 6], 2, 2, recompute="r"),
            pipeline([3, 4], [0, 2, 6], 2, 2, recompute="nr"),
        ],
        "1f1b",
        {"precision": "bf16", "clip_grad": 0.05, "emulate": True, "slow_gpu": "V100-32GB"},
    ),
    # One plan, two schedules: pipeline 0 runs GPipe with fewer micro-batches than stages.
    "llama-2pipes-3+2-gpipe-beside-1f1b": (
        "tiny-llama",
        [
            pipeline([0, 1, 2], [0, 2, 4, 6], 2, 2, schedule="gpipe"),
            pipeline([3, 4], [0, 3, 6], 1, 3),
        ],
        "1f1b",
        {"fp64": True},
    ),
    # Multi-chunk schedules (a device runs several stages, `pipeline` lists each stage's device):
    # three schedules in one plan, pipelines of different shapes. Pipeline 0 interleaves two
    # chunks per device; pipeline 2 is a V (its first device holds the embedding and the head,
    # one shared tied weight); pipeline 1 is plain 1F1B.
    "gpt-3pipes-interleaved2x2+1f1b2+zbv2x2": (
        "tiny-gpt",
        [
            pipeline([0, 1, 0, 1], [0, 1, 3, 4, 6], 1, 4, schedule="interleaved-1f1b"),
            pipeline([2, 3], [0, 3, 6], 2, 2),
            pipeline([4, 5, 5, 4], [0, 2, 3, 5, 6], 1, 4, schedule="zbv"),
        ],
        "1f1b",
        {"fp64": True},
    ),
    # One pipeline, zero-bubble interleaving: the tied weight's copies on two ranks.
    "gpt-1pipe-izb2x2-clip": (
        "tiny-gpt",
        [pipeline([0, 1, 0, 1], [0, 1, 3, 5, 6], 1, 4, schedule="interleaved-zb")],
        "1f1b",
        {"fp64": True, "clip_grad": 0.05},
    ),
    # Zero-bubble interleaving, three chunks per device (every layer its own stage), beside
    # GPipe; clipping needs the weight-grad actions' gradients to be final before the sync.
    "llama-2pipes-izb3x2+gpipe3-clip": (
        "tiny-llama",
        [
            pipeline([0, 1, 0, 1, 0, 1], [0, 1, 2, 3, 4, 5, 6], 1, 6, schedule="interleaved-zb"),
            pipeline([2, 3, 4], [0, 2, 4, 6], 2, 2, schedule="gpipe"),
        ],
        "1f1b",
        {"fp64": True, "clip_grad": 0.05},
    ),
    # Both loop-placed schedules at three chunks per device (every layer its own stage), the
    # tied embedding and head on different ranks of each: the chunk counts the schedule pass
    # tries (`schedules.CHUNK_COUNTS`) beyond two.
    "gpt-2pipes-interleaved3x2+izb3x2": (
        "tiny-gpt",
        [
            pipeline([0, 1, 0, 1, 0, 1], [0, 1, 2, 3, 4, 5, 6], 1, 6, schedule="interleaved-1f1b"),
            pipeline([2, 3, 2, 3, 2, 3], [0, 1, 2, 3, 4, 5, 6], 1, 4, schedule="interleaved-zb"),
        ],
        "1f1b",
        {"fp64": True},
    ),
    # A V over three devices with recomputation on some stages, beside interleaved 1F1B.
    "gpt-2pipes-zbv3x2-recompute+interleaved2x2-sgd": (
        "tiny-gpt",
        [
            pipeline([0, 1, 2, 2, 1, 0], [0, 1, 2, 3, 4, 5, 6], 1, 6, "rnrr--", schedule="zbv"),
            pipeline([3, 4, 3, 4], [0, 2, 3, 4, 6], 1, 4, schedule="interleaved-1f1b"),
        ],
        "zbv",
        # Validation runs the schedules forward only between steps.
        {"fp64": True, "optimizer": "sgd", "lr": 0.1, "eval_every": 2, "eval_batches": 1},
    ),
    "llama-2pipes-zbv2x2+interleaved-zb2x2-bf16": (
        "tiny-llama",
        [
            pipeline([0, 1, 1, 0], [0, 2, 3, 4, 6], 1, 4, schedule="zbv"),
            pipeline([2, 3, 2, 3], [0, 1, 3, 5, 6], 2, 4, schedule="interleaved-zb"),
        ],
        "1f1b",
        {"precision": "bf16", "clip_grad": 0.05},
    ),
    # DualPipeV (overlapped forward+backward pairs, full and split backwards on one stage) beside
    # 1F1B and GPipe: three shapes, 6 micro-batches on the V's 4 stages; clipping needs each
    # stage's gradients final at its last full backward or weight-grad action.
    "llama-3pipes-dualpipev2x2+1f1b2+gpipe1-clip": (
        "tiny-llama",
        [
            pipeline([0, 1, 1, 0], [0, 2, 3, 4, 6], 1, 6, schedule="dualpipev"),
            pipeline([2, 3], [0, 3, 6], 2, 2),
            pipeline([4], [0, 6], 2, 1, schedule="gpipe"),
        ],
        "1f1b",
        {"fp64": True, "clip_grad": 0.05},
    ),
    # A DualPipeV over three devices (the tied embedding and head on its first), recomputing
    # some stages, beside a ZB-V of another cut; validation runs both forward only.
    "gpt-2pipes-dualpipev3x2-recompute+zbv2x2-sgd": (
        "tiny-gpt",
        [
            pipeline(
                [0, 1, 2, 2, 1, 0], [0, 1, 2, 3, 4, 5, 6], 1, 7, "rnr-r-", schedule="dualpipev"
            ),
            pipeline([3, 4, 4, 3], [0, 2, 3, 5, 6], 1, 4, schedule="zbv"),
        ],
        "dualpipev",
        {"fp64": True, "optimizer": "sgd", "lr": 0.1, "eval_every": 2, "eval_batches": 1},
    ),
    # A bucket per model chunk (`grad_buckets`): pipelines cut alike beside a one-stage one, so
    # every device's two chunks have the same owners and still sync as two buckets, the later
    # chunk's while the device runs the other. Every multi-chunk schedule, three pipelines each.
    "gpt-3pipes-interleaved2x2+izb2x2+1stage-chunk-buckets": (
        "tiny-gpt",
        [
            pipeline([0, 1, 0, 1], [0, 1, 3, 4, 6], 1, 4, schedule="interleaved-1f1b"),
            pipeline([2, 3, 2, 3], [0, 1, 3, 4, 6], 1, 4, schedule="interleaved-zb"),
            pipeline([4], [0, 6], 2, 1),
        ],
        "1f1b",
        {"fp64": True, "clip_grad": 0.05},
    ),
    "llama-3pipes-zbv2x2+dualpipev2x2+gpipe1-chunk-buckets": (
        "tiny-llama",
        [
            pipeline([0, 1, 1, 0], [0, 2, 3, 5, 6], 1, 4, schedule="zbv"),
            pipeline([2, 3, 3, 2], [0, 2, 3, 5, 6], 1, 4, schedule="dualpipev"),
            pipeline([4], [0, 6], 2, 1, schedule="gpipe"),
        ],
        "1f1b",
        {"fp64": True},
    ),
    # ZB-H1 (zbh1: one stage per device, split backwards, rank r's Ws deferred by r) beside
    # 1F1B and interleaved zero-bubble: three shapes, three schedules; the tied embedding and
    # head on the first and last of its ranks; clipping needs its Ws done before the sync.
    "gpt-3pipes-zbh1x4+1f1b2+izb2x2-clip": (
        "tiny-gpt",
        [
            pipeline([0, 1, 2, 3], [0, 1, 3, 5, 6], 1, 4, schedule="zbh1"),
            pipeline([4, 5], [0, 3, 6], 2, 2),
            pipeline([6, 7, 6, 7], [0, 1, 3, 5, 6], 1, 4, schedule="interleaved-zb"),
        ],
        "1f1b",
        {"fp64": True, "clip_grad": 0.05},
    ),
    # ZB-H1 over three ranks with more micro-batches than ranks (two rounds) beside GPipe.
    "llama-2pipes-zbh1x3+gpipe2": (
        "tiny-llama",
        [
            pipeline([0, 1, 2], [0, 2, 4, 6], 1, 6, schedule="zbh1"),
            pipeline([3, 4], [0, 3, 6], 2, 2, schedule="gpipe"),
        ],
        "1f1b",
        {"fp64": True},
    ),
    "gpt-2pipes-3+1-fp16-gpipe": (
        "tiny-gpt",
        [pipeline([0, 1, 2], [0, 2, 4, 6], 1, 4), pipeline([3], [0, 6], 2, 2)],
        "gpipe",
        {"precision": "fp16"},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pipelined_matches_single_process(case, tmp_path):
    model, pipes, schedule, opts = CASES[case]
    opts = dict(opts)
    plan = make_plan(
        model,
        pipes,
        schedule,
        precision=opts.pop("precision", "fp32"),
        slow_gpu=opts.pop("slow_gpu", None),
    )
    results = train(plan, tmp_path, steps=3, verify=True, **opts)
    report = results[0].verify
    assert report is not None and all(r.verify is None for r in results[1:])
    assert (
        report.tolerance
        == DEFAULT_VERIFY_TOL[plan.train.precision if not opts.get("fp64") else "fp64"]
    )
    assert report.max_param_diff <= report.tolerance, report
    assert report.max_loss_diff <= report.tolerance, report
    assert [r.step for r in results[0].records] == [1, 2, 3]
    if "clip_grad" in opts:  # clipping really scaled the gradients
        assert all(r.grad_norm > opts["clip_grad"] for r in results[0].records)
