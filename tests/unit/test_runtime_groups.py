"""Rank <-> device mapping and the reduction sets a plan needs (no process groups created)."""

from __future__ import annotations

import pytest

from hetpp.runtime.groups import RankMap
from hetpp.specs import PRESETS, PipelinePlan, Plan, StagePlan
from hetpp.specs.errors import SpecError


def _plan(model: str = "tiny-gpt") -> Plan:
    def pipe(devices, cuts):
        stages = tuple(
            StagePlan(devices=(d,), layers=(a, b)) for d, a, b in zip(devices, cuts[:-1], cuts[1:])
        )
        return PipelinePlan(stages=stages, micro_batch_size=1, num_micro_batches=3)

    # Devices 2, 5, 7, 9: ranks 0..3 in device order.
    return Plan(
        global_batch=6,
        seq_len=8,
        model=PRESETS[model],
        pipelines=(pipe([9, 2, 5], [0, 2, 4, 6]), pipe([7], [0, 6])),
    ).validate_plan()


def test_ranks_are_the_plan_devices_in_increasing_order():
    ranks = RankMap.of(_plan())
    assert ranks.devices == (2, 5, 7, 9)
    roles = [ranks.role(r) for r in range(4)]
    assert [(r.device, r.pipeline, r.stages, r.layers) for r in roles] == [
        (2, 0, (1,), ((2, 4),)),
        (5, 0, (2,), ((4, 6),)),
        (7, 1, (0,), ((0, 6),)),
        (9, 0, (0,), ((0, 2),)),
    ]
    assert ranks.pipelines == ((3, 0, 1), (2,))
    with pytest.raises(SpecError, match="rank 4 outside the plan's 4 ranks"):
        ranks.role(4)


def test_blocks_and_tied_holders_in_ranks():
    ranks = RankMap.of(_plan())
    # Latest layers first: the order backward finishes them in.
    assert ranks.buckets == ((((4, 6),), (1, 2)), (((2, 4),), (0, 2)), (((0, 2),), (3, 2)))
    assert ranks.tied == (1, 2, 3)  # embedding and head ranks of both pipelines
    assert RankMap.of(_plan("tiny-llama")).tied == ()


def test_a_rank_of_a_multi_chunk_pipeline_owns_every_stage_placed_on_it():
    def pipe(devices, cuts, schedule, m):
        stages = tuple(
            StagePlan(devices=(d,), layers=(a, b)) for d, a, b in zip(devices, cuts[:-1], cuts[1:])
        )
        return PipelinePlan(
            stages=stages, micro_batch_size=1, num_micro_batches=m, schedule=schedule
        )

    plan = Plan(
        global_batch=8,
        seq_len=8,
        model=PRESETS["tiny-gpt"],
        pipelines=(
            pipe([3, 1, 3, 1], [0, 1, 3, 4, 6], "interleaved-1f1b", 4),  # loop: 3 1 3 1
            pipe([0, 2, 2, 0], [0, 2, 3, 5, 6], "zbv", 4),  # V: 0 2 2 0
        ),
    ).validate_plan()
    ranks = RankMap.of(plan)
    roles = [ranks.role(r) for r in range(4)]
    assert [(r.pipeline, r.stages, r.layers, r.first, r.last) for r in roles] == [
        (1, (0, 3), ((0, 2), (5, 6)), True, True),
        (0, (1, 3), ((1, 3), (4, 6)), False, True),
        (1, (1, 2), ((2, 3), (3, 5)), False, False),
        (0, (0, 2), ((0, 1), (3, 4)), True, False),
    ]
    # Group rank i is the pipeline's i-th device by first stage (what torch's placement maps to).
    assert ranks.pipelines == ((3, 1), (0, 2))
    # Stage 0 and the last stage's ranks hold the tied weight: the V's first rank holds both.
    assert ranks.tied == (0, 1, 3)
    # One owner per pipeline per block; rank 1 has buckets spanning two of its stages.
    assert ranks.buckets[:2] == ((((1, 2), (5, 6)), (1, 0)), (((2, 3), (4, 5)), (1, 2)))
