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
    # One owner per pipeline per block, a bucket per owning stage: rank 1's blocks (1, 2) and
    # (5, 6) have the same owners (1, 0) but lie in two of its chunks (stages 1 and 3): two
    # buckets, the later chunk's first.
    assert ranks.buckets == (
        (((5, 6),), (1, 0)),
        (((4, 5),), (1, 2)),
        (((3, 4),), (3, 2)),
        (((2, 3),), (1, 2)),
        (((1, 2),), (1, 0)),
        (((0, 1),), (3, 0)),
    )


def _tp_plan(groups: list[tuple[int, ...]]) -> Plan:
    cuts = [0, 3, 6] if len(groups) == 2 else [0, 2, 4, 6]
    stages = tuple(
        StagePlan(devices=g, layers=(a, b)) for g, a, b in zip(groups, cuts[:-1], cuts[1:])
    )
    pipe = PipelinePlan(stages=stages, micro_batch_size=1, num_micro_batches=3)
    return Plan(
        global_batch=3, seq_len=8, model=PRESETS["tiny-gpt"], pipelines=(pipe,)
    ).validate_plan()


def test_a_pipeline_whose_tp_degree_changes_runs_as_lanes():
    # 1 -> 2 -> 1: two lanes; the narrow stages' ranks are in both, each rank runs its first.
    ranks = RankMap.of(_tp_plan([(0,), (1, 2), (3,)]))
    assert ranks.chains == ((0, 1, 3), (0, 2, 3))
    assert [ranks.role(r).chain for r in range(4)] == [(0, 1, 3), (0, 1, 3), (0, 2, 3), (0, 1, 3)]
    links = {r: {k.stage: (k.source, k.targets) for k in ranks.role(r).links} for r in range(4)}
    # Activations: rank 0 sends to both ranks of stage 1, only its TP rank 0 on to stage 2.
    # Gradients: stage 2 sends to both, only stage 1's TP rank 0 back to stage 0.
    assert links == {
        0: {1: (1, (1, 2))},
        1: {0: (0, (0,)), 2: (3, (3,))},
        2: {0: (0, ()), 2: (3, ())},
        3: {1: (1, (1, 2))},
    }
    assert all(ranks.role(r).p2p == (0, 1, 2, 3) for r in range(4))


def test_lanes_of_degrees_four_and_two_nest():
    ranks = RankMap.of(_tp_plan([(0, 1, 2, 3), (4, 5)]))
    assert ranks.chains == ((0, 4), (1, 4), (2, 5), (3, 5))
    source = {r: [(k.source, k.targets) for k in ranks.role(r).links] for r in range(6)}
    assert source == {
        0: [(4, (4,))], 1: [(4, ())], 2: [(5, (5,))], 3: [(5, ())],
        4: [(0, (0, 1))], 5: [(2, (2, 3))],
    }  # fmt: skip
    # One degree: TP rank j talks to TP rank j (torchtitan's lanes); no TP: no links.
    same = RankMap.of(_tp_plan([(0, 1), (2, 3)]))
    assert [[(k.source, k.targets) for k in same.role(r).links] for r in range(4)] == [
        [(2, (2,))],
        [(3, (3,))],
        [(0, (0,))],
        [(1, (1,))],
    ]
    plain = RankMap.of(_tp_plan([(0,), (1,)]))
    assert all(plain.role(r).links == () and plain.role(r).p2p == () for r in range(2))


def test_a_torch_without_sort_ranks_builds_ascending_chains_and_refuses_others(monkeypatch):
    from datetime import timedelta

    from hetpp.runtime import groups

    made = []

    def old_new_group(ranks, timeout=None):  # torch 2.11's keywords: no sort_ranks
        made.append(list(ranks))
        return f"group{ranks}"

    monkeypatch.setattr(groups.dist, "new_group", old_new_group)
    assert groups._ordered_group((0, 2, 3), timedelta(seconds=1)) == "group[0, 2, 3]"
    with pytest.raises(SpecError, match=r"ranks \[3, 0, 1\].*sort_ranks"):
        groups._ordered_group((3, 0, 1), timedelta(seconds=1))
    assert made == [[0, 2, 3]]  # the refused chain asked torch for nothing
