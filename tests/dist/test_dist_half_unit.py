"""Plans cut at half blocks (`layer_unit` half) train as single-process training does.

As `test_dist_equivalence`: 3 steps with --verify on forked gloo ranks, fp64, every copy of every
parameter and the losses within the fp64 tolerance of the single-process run.
"""

from __future__ import annotations

import pytest
from disthelpers import make_plan, pipeline, train

from hetpp.runtime.options import DEFAULT_VERIFY_TOL

pytestmark = pytest.mark.dist

# At half unit tiny-gpt and tiny-llama have 10 layers: embedding, 4 x (attention, MLP), head.
# An even cut ends a stage after an attention half, inside its block.
CASES = {
    # name: (model, pipelines, schedule, options)
    "gpt-2pipes-3+2-midblock-clip": (
        "tiny-gpt",
        [pipeline([0, 1, 2], [0, 2, 5, 10], 2, 3), pipeline([3, 4], [0, 4, 10], 1, 4)],
        "1f1b",
        {"clip_grad": 0.05},
    ),
    "llama-2pipes-2+3-midblock-gpipe-recompute": (
        "tiny-llama",
        [
            pipeline([0, 1], [0, 6, 10], 2, 2, recompute="rn"),
            pipeline([2, 3, 4], [0, 3, 8, 10], 1, 4, recompute="nrr", schedule="gpipe"),
        ],
        "1f1b",
        {},
    ),
    # Multi-chunk: an interleaved pipeline and a V, each cut mid-block.
    "gpt-2pipes-interleaved2x2+zbv2x2-midblock": (
        "tiny-gpt",
        [
            pipeline([0, 1, 0, 1], [0, 2, 5, 8, 10], 1, 4, schedule="interleaved-1f1b"),
            pipeline([2, 3, 3, 2], [0, 3, 6, 9, 10], 1, 4, schedule="zbv"),
        ],
        "1f1b",
        {},
    ),
    # The split-backward schedules hpp's half-block plans run (docs/benchmarks-planner.md):
    # ZB-H1, DualPipeV and interleaved ZB, each cut mid-block, in one plan.
    "llama-3pipes-zbh1x3+dualpipev2x2+izb2x2-midblock": (
        "tiny-llama",
        [
            pipeline([0, 1, 2], [0, 4, 7, 10], 1, 4, schedule="zbh1"),
            pipeline([3, 4, 4, 3], [0, 2, 5, 8, 10], 1, 6, schedule="dualpipev"),
            pipeline([5, 6, 5, 6], [0, 3, 6, 8, 10], 1, 4, schedule="interleaved-zb"),
        ],
        "1f1b",
        {},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_half_unit_pipelines_match_single_process(case, tmp_path):
    model, pipes, schedule, opts = CASES[case]
    plan = make_plan(model, pipes, schedule, layer_unit="half")
    assert plan.model.layer_unit == "half" and plan.layer_list_len == 10
    results = train(plan, tmp_path, steps=3, verify=True, fp64=True, **opts)
    report = results[0].verify
    assert report is not None and report.tolerance == DEFAULT_VERIFY_TOL["fp64"]
    assert report.max_param_diff <= report.tolerance, report
    assert report.max_loss_diff <= report.tolerance, report
    assert [r.step for r in results[0].records] == [1, 2, 3]
