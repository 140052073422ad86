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
    assert [(r.device, r.pipeline, r.stage, r.layers) for r in roles] == [
        (2, 0, 1, (2, 4)),
        (5, 0, 2, (4, 6)),
        (7, 1, 0, (0, 6)),
        (9, 0, 0, (0, 2)),
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
