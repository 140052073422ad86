"""Rank <-> device mapping and the reduction sets a plan needs (no process groups created)."""

from __future__ import annotations

from hetpp.runtime.groups import bucket_ranks, pipeline_ranks, role_of, tied_ranks
from hetpp.specs import PRESETS, PipelinePlan, Plan, StagePlan


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
    plan = _plan()
    roles = [role_of(plan, r) for r in range(4)]
    assert [(r.device, r.pipeline, r.stage, r.layers) for r in roles] == [
        (2, 0, 1, (2, 4)),
        (5, 0, 2, (4, 6)),
        (7, 1, 0, (0, 6)),
        (9, 0, 0, (0, 2)),
    ]
    assert pipeline_ranks(plan) == [(3, 0, 1), (2,)]


def test_blocks_and_tied_holders_in_ranks():
    plan = _plan()
    # Latest layers first: the order backward finishes them in.
    assert bucket_ranks(plan) == [(((4, 6),), (1, 2)), (((2, 4),), (0, 2)), (((0, 2),), (3, 2))]
    assert tied_ranks(plan) == (1, 2, 3)  # embedding and head ranks of both pipelines
    assert tied_ranks(_plan("tiny-llama")) == ()
