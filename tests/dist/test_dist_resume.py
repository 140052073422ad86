"""A checkpoint taken under one plan resumes under another plan on a different number of ranks."""

from __future__ import annotations

import pytest
from disthelpers import make_plan, pipeline, train

from hetpp.runtime import checkpoint

pytestmark = pytest.mark.dist


def test_resume_under_another_plan_equals_an_uninterrupted_run(tmp_path):
    # 3 ranks, tied copies on different ranks -> 2 ranks, other cuts, other batch split.
    plan_a = make_plan("tiny-gpt", [pipeline([0, 1], [0, 3, 6], 2, 5), pipeline([2], [0, 6], 3, 2)])
    plan_b = make_plan("tiny-gpt", [pipeline([1, 0], [0, 4, 6], 4, 4)], schedule="gpipe")
    # A cosine schedule over the whole 8 steps: the first part stops at 4, the resumed part
    # continues the same schedule.
    opts = {
        "fp64": True,
        "clip_grad": 0.05,
        "lr_schedule": "cosine",
        "warmup_steps": 2,
        "decay_steps": 8,
    }
    ckpt = tmp_path / "ckpt"
    first = train(plan_a, tmp_path, steps=4, checkpoint_dir=str(ckpt), **opts)
    saved = checkpoint.latest(ckpt)
    assert saved is not None and saved.name == "step_00000004"
    assert sorted(p.name for p in saved.iterdir()) == [
        "COMPLETE",
        *(f"layer_{i:04d}.pt" for i in range(6)),
        "meta.json",
    ]
    assert checkpoint.read_meta(saved).samples == 4 * plan_a.global_batch
    resumed = train(
        plan_b, tmp_path, steps=8, checkpoint_dir=str(ckpt), resume=True, verify=True, **opts
    )
    whole = train(plan_a, tmp_path, steps=8, **opts)

    assert [r.step for r in resumed[0].records] == [5, 6, 7, 8]
    lrs = [r.lr for r in first[0].records + resumed[0].records]
    assert lrs == pytest.approx([r.lr for r in whole[0].records], abs=0, rel=0)
    assert len(set(lrs)) == 7  # every rate differs but two: the warm-up ends where decay starts
    losses = [r.loss for r in first[0].records + resumed[0].records]
    assert losses == pytest.approx([r.loss for r in whole[0].records], abs=1e-10, rel=0)
    assert resumed[0].verify is not None and resumed[0].verify.ok, resumed[0].verify
    assert checkpoint.latest(ckpt).name == "step_00000008"


def test_a_multi_chunk_plan_resumes_under_another_schedule(tmp_path):
    # A V (its first rank holds embedding and head, one shared tied weight) -> interleaved
    # zero-bubble chunks beside a 1F1B pipeline: layer files are one per layer whoever wrote them.
    plan_a = make_plan("tiny-gpt", [pipeline([0, 1, 1, 0], [0, 2, 3, 5, 6], 2, 4, schedule="zbv")])
    plan_b = make_plan(
        "tiny-gpt",
        [
            pipeline([1, 2, 1, 2], [0, 1, 3, 4, 6], 1, 4, schedule="interleaved-zb"),
            pipeline([0], [0, 6], 2, 2),
        ],
    )
    ckpt = tmp_path / "ckpt"
    first = train(plan_a, tmp_path, steps=2, checkpoint_dir=str(ckpt), fp64=True)
    assert sorted(p.name for p in checkpoint.latest(ckpt).iterdir()) == [
        "COMPLETE",
        *(f"layer_{i:04d}.pt" for i in range(6)),
        "meta.json",
    ]
    resumed = train(plan_b, tmp_path, steps=4, checkpoint_dir=str(ckpt), resume=True, fp64=True)
    whole = train(plan_a, tmp_path, steps=4, fp64=True)
    assert [r.step for r in resumed[0].records] == [3, 4]
    losses = [r.loss for r in first[0].records + resumed[0].records]
    assert losses == pytest.approx([r.loss for r in whole[0].records], abs=1e-10, rel=0)
