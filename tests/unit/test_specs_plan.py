import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from hetpp.specs import PRESETS, Plan, SpecError, load_plan
from hetpp.specs.plan import PLAN_VERSION, derive_grad_blocks


def make_plan(cluster, pipelines, batch=None, **kw):
    batch = batch or sum(p["micro_batch_size"] * p["num_micro_batches"] for p in pipelines)
    return Plan(
        global_batch=batch,
        seq_len=64,
        model=PRESETS["tiny-gpt"],
        cluster=cluster,
        pipelines=pipelines,
        **kw,
    )


def pipe(stages, mbs=1, m=4):
    return {
        "stages": [{"devices": [d], "layers": list(r)} for d, r in stages],
        "micro_batch_size": mbs,
        "num_micro_batches": m,
    }


def test_grad_blocks_cut_at_union_of_boundaries(small_cluster):
    # tiny-gpt: 4 blocks -> layer list of 6.
    plan = make_plan(
        small_cluster,
        [pipe([(0, (0, 3)), (1, (3, 6))]), pipe([(2, (0, 2)), (3, (2, 4)), (4, (4, 6))])],
    )
    blocks = [(b.layers, b.owners) for b in derive_grad_blocks(plan)]
    assert blocks == [((0, 2), (0, 2)), ((2, 3), (0, 3)), ((3, 4), (1, 3)), ((4, 6), (1, 4))]
    assert plan.validate_plan() is plan


def test_roundtrip_with_derived_blocks(small_cluster, tmp_path):
    plan = make_plan(small_cluster, [pipe([(0, (0, 6))], mbs=2, m=3), pipe([(1, (0, 6))], m=2)])
    plan.with_derived().save(tmp_path / "p.json")
    back = load_plan(tmp_path / "p.json", small_cluster)
    assert back.blocks() == plan.blocks() and back.global_batch == 8


@pytest.mark.parametrize(
    ("pipelines", "batch", "match"),
    [
        ([pipe([(0, (0, 3)), (1, (4, 6))])], None, r"stages\[1\]\.layers: layers \[4, 6\)"),
        ([pipe([(0, (0, 3)), (1, (3, 5))])], None, "stages end at layer 5, expected 6"),
        ([pipe([(0, (0, 6))]), pipe([(0, (0, 6))])], None, "device 0 is already used"),
        ([pipe([(9, (0, 6))])], None, "device 9 does not exist"),
        ([pipe([(0, (0, 6))], m=4)], 5, "expected global_batch = 5"),
        ([pipe([(0, (0, 2)), (1, (2, 4)), (2, (4, 6))], m=2)], None, "1F1B needs"),
    ],
)
def test_invalid_plans_name_the_field(small_cluster, pipelines, batch, match):
    with pytest.raises(SpecError, match=match):
        make_plan(small_cluster, pipelines, batch).validate_plan()


def test_gpipe_allows_fewer_micro_batches_than_stages(small_cluster):
    p = make_plan(
        small_cluster, [pipe([(0, (0, 2)), (1, (2, 4)), (2, (4, 6))], m=2)], schedule="gpipe"
    )
    p.validate_plan()


def test_plan_for_another_cluster_is_rejected(small_cluster):
    other = small_cluster.model_copy(update={"name": "other"})
    plan = make_plan(small_cluster, [pipe([(0, (0, 6))])])
    with pytest.raises(SpecError, match="made for cluster 'small'"):
        plan.validate_plan(other)


def test_a_version_1_file_is_upgraded_and_gets_trainspec_defaults(small_cluster, tmp_path):
    # Version 1 kept TrainSpec's fields at the top level with defaults of its own: an fp32 plan
    # was costed with 2 B gradients and 12 B optimizer state. Upgraded, TrainSpec's fp32
    # defaults (4 and 8) apply, as they do for the planner.
    v2 = make_plan(small_cluster, [pipe([(0, (0, 6))], mbs=2, m=2)], precision="fp32")
    v1 = json.loads(v2.to_json())
    v1.update(version=1, **v1.pop("train"))
    for key in ("grad_bytes_per_param", "optimizer_bytes_per_param", "master_weights"):
        del v1[key]  # master_weights is newer than version 1
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    loaded = load_plan(tmp_path / "v1.json")
    assert loaded.version == PLAN_VERSION == 2
    assert loaded.train.grad_bytes_per_param == 4 and loaded.train.optimizer_bytes_per_param == 8
    assert loaded == v2
    assert json.loads(loaded.to_json())["train"]["precision"] == "fp32"


def test_the_embedded_trainspec_validates_itself(small_cluster):
    with pytest.raises(ValidationError, match="optimizer_bytes_per_param"):
        make_plan(small_cluster, [pipe([(0, (0, 6))])], optimizer_bytes_per_param=-1)


def test_a_pipeline_may_run_its_own_schedule(small_cluster):
    # GPipe runs fewer micro-batches than stages; the plan's default (1F1B) would refuse it.
    gpipe = {**pipe([(0, (0, 2)), (1, (2, 4)), (2, (4, 6))], m=2), "schedule": "gpipe"}
    plan = make_plan(small_cluster, [gpipe, pipe([(3, (0, 6))], m=2)]).validate_plan()
    assert [p.schedule_in(plan.train).name for p in plan.pipelines] == ["gpipe", "1f1b"]
    back = Plan.model_validate_json(plan.to_json())
    assert back.pipelines[0].schedule == "gpipe" and back.pipelines[1].schedule is None
    with pytest.raises(SpecError, match="1F1B needs"):
        make_plan(small_cluster, [{**gpipe, "schedule": "1f1b"}]).validate_plan()


def test_one_stage_per_device_unless_the_schedule_interleaves(small_cluster):
    again = pipe([(0, (0, 2)), (1, (2, 4)), (0, (4, 6))])
    plan = make_plan(small_cluster, [again])
    assert plan.pipelines[0].devices == [0, 1] and plan.num_devices == 2
    with pytest.raises(SpecError, match=r"pipelines\[0\]\.stages: 3 stages on 2 devices; sched"):
        plan.validate_plan()


@pytest.mark.parametrize(
    ("placement", "chunks", "devices"),
    [("one", 1, [0, 1, 2]), ("loop", 2, [0, 1, 2, 0, 1, 2]), ("v", 2, [0, 1, 2, 2, 1, 0])],
)
def test_placement_puts_each_stage_on_its_device(placement, chunks, devices):
    from dataclasses import replace

    from hetpp.specs.schedule import SCHEDULES

    spec = replace(SCHEDULES["1f1b"], placement=placement)
    assert spec.allows_chunks(chunks)
    assert spec.allows_chunks(chunks + 1) == (placement == "loop")
    assert [spec.device_index(s, 3) for s in range(3 * chunks)] == devices


def test_multi_chunk_schedules_hold_torchs_micro_batch_rules(small_cluster):
    # 2 devices x 2 chunks of tiny-gpt's 6 layers; stage i on device i mod 2 (loop) or in a V.
    loop = [(0, (0, 2)), (1, (2, 3)), (0, (3, 4)), (1, (4, 6))]
    vee = [(0, (0, 2)), (1, (2, 3)), (1, (3, 4)), (0, (4, 6))]
    ok = make_plan(small_cluster, [{**pipe(loop, m=6), "schedule": "interleaved-1f1b"}])
    assert ok.validate_plan().pipelines[0].chunks == 2
    # 5 micro-batches on 2 devices: 2 rounds, and 5 is not a multiple of 2 (torch refuses it)
    with pytest.raises(SpecError, match=r"num_micro_batches: interleaved-zb needs .* rounds"):
        make_plan(
            small_cluster, [{**pipe(loop, m=5), "schedule": "interleaved-zb"}]
        ).validate_plan()
    make_plan(small_cluster, [{**pipe(vee, m=3), "schedule": "zbv"}]).validate_plan()
    with pytest.raises(SpecError, match=r"DUALPIPEV needs num_micro_batches >= stages \(3 < 4\)"):
        make_plan(small_cluster, [{**pipe(vee, m=3), "schedule": "dualpipev"}]).validate_plan()
    with pytest.raises(SpecError, match="places stage 2 of this pipeline on device 1"):
        make_plan(small_cluster, [{**pipe(loop, m=4), "schedule": "zbv"}]).validate_plan()


def tp_plan(cluster, stages, m=4):
    return make_plan(
        cluster,
        [{"stages": stages, "micro_batch_size": 1, "num_micro_batches": m}],
    )


def test_a_stage_with_k_devices_is_a_tensor_parallel_group(small_cluster):
    plan = tp_plan(
        small_cluster,
        [{"devices": [0, 1], "layers": [0, 3]}, {"devices": [2, 3, 4, 5], "layers": [3, 6]}],
    ).validate_plan()
    assert [s.tp for s in plan.pipelines[0].stages] == [2, 4]
    assert plan.num_devices == 6
    # A stage is named by its lead device: the owners of its gradient blocks.
    assert [b.owners for b in plan.blocks()] == [(0,), (2,)]


@pytest.mark.parametrize(
    ("devices", "match"),
    [
        ([1, 2], "one node with one GPU type; got 1 \\(A100-80GB, node 0\\), 2 \\(V100-16GB"),
        ([2, 3, 4], "num_heads \\(4\\) is not a multiple of 3"),
        ([0, 0], "device 0 is already used"),
    ],
)
def test_bad_tensor_parallel_groups_name_the_field(small_cluster, devices, match):
    others = [d for d in range(6) if d not in devices][:1]
    stages = [{"devices": devices, "layers": [0, 3]}, {"devices": others, "layers": [3, 6]}]
    with pytest.raises(SpecError, match=match) as e:
        tp_plan(small_cluster, stages).validate_plan()
    assert e.value.field == "pipelines[0].stages[0].devices"


def test_a_flashflex_style_plan_with_tp_stages_loads_and_runs(tmp_path):
    # FlashFlex / HexiScale write a stage as a list of GPUs: k GPUs are a TP group. Here an
    # H100 TP-4 stage feeds an A100 TP-2 stage, next to a T4 pipeline without TP.
    src = Path(__file__).parent / "data" / "plan-flashflex-tp.json"
    plan = load_plan(src)
    stages = [[(s.devices, s.layers) for s in p.stages] for p in plan.pipelines]
    assert stages == [
        [((0, 1, 2, 3), (0, 20)), ((4, 5), (20, 34))],
        [((8, 9, 10, 11), (0, 9)), ((12, 13, 14, 15), (9, 18)), ((16, 17, 18, 19), (18, 26)),
         ((20, 21, 22, 23), (26, 34))],
    ]  # fmt: skip
    assert plan.num_devices == 22
    from hetpp.runtime.contract import check_executable
    from hetpp.runtime.groups import RankMap

    check_executable(plan)  # the TP-4 -> TP-2 pipeline runs as four lanes
    assert RankMap.of(plan).chains[:4] == ((0, 4), (1, 4), (2, 5), (3, 5))


def test_the_runtime_runs_tp_degrees_that_change_along_a_pipeline(small_cluster):
    from hetpp.runtime.contract import check_executable

    ok = tp_plan(
        small_cluster,
        [{"devices": [0, 1], "layers": [0, 3]}, {"devices": [2, 3], "layers": [3, 6]}],
    ).validate_plan()
    check_executable(ok)
    mixed = [{"devices": [0, 1], "layers": [0, 3]}, {"devices": [2], "layers": [3, 6]}]
    check_executable(tp_plan(small_cluster, mixed).validate_plan())  # lanes (`runtime.lanes`)
    # TP stages with optimizer sharding: a valid plan the runtime does not run (exit 2)
    two = [{"devices": [0, 1], "layers": [0, 3]}, {"devices": [2, 3], "layers": [3, 6]}]
    sharded = make_plan(
        small_cluster,
        [{"stages": two, "micro_batch_size": 1, "num_micro_batches": 4}, pipe([(4, (0, 6))])],
        sharding="optimizer",
    ).validate_plan()
    with pytest.raises(SpecError, match="sharding 'optimizer' with tensor-parallel") as e:
        check_executable(sharded)
    assert e.value.field == "sharding"


def test_tp_stages_run_one_stage_per_device(small_cluster):
    # a TP group under an interleaved schedule: refused by the plan check, naming the stages
    loop = [
        {"devices": [0, 1], "layers": [0, 2]},
        {"devices": [2], "layers": [2, 3]},
        {"devices": [0, 1], "layers": [3, 4]},
        {"devices": [2], "layers": [4, 6]},
    ]
    plan = make_plan(
        small_cluster,
        [{"stages": loop, "micro_batch_size": 1, "num_micro_batches": 4,
          "schedule": "interleaved-1f1b"}],
    )  # fmt: skip
    with pytest.raises(SpecError, match="multi-chunk schedules with TP are not supported") as e:
        plan.validate_plan()
    assert e.value.field == "pipelines[0].stages"
    # a TP group's device may not run a second stage of its pipeline either
    reuse = [{"devices": [0, 1], "layers": [0, 3]}, {"devices": [1], "layers": [3, 6]}]
    with pytest.raises(SpecError, match=r"device 1 is already used by pipelines\[0\]\.stages\[0\]"):
        tp_plan(small_cluster, reuse).validate_plan()
