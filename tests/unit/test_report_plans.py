"""The plan summary line says where recomputation runs (per stage since plan format 2)."""

from hetpp.report.plans import recompute_summary
from hetpp.specs import PRESETS, Plan


def _plan(cluster, flags, default):
    stages = [
        {"devices": [0], "layers": [0, 3], "recompute": flags[0]},
        {"devices": [1], "layers": [3, 6], "recompute": flags[1]},
    ]
    pipe = {"stages": stages, "micro_batch_size": 1, "num_micro_batches": 4}
    return Plan(global_batch=4, seq_len=64, model=PRESETS["tiny-gpt"], cluster=cluster,
                pipelines=[pipe], recompute=default)  # fmt: skip


def test_recompute_summary_counts_the_stages(small_cluster):
    assert recompute_summary(_plan(small_cluster, [None, None], False)) == "recompute off"
    assert recompute_summary(_plan(small_cluster, [None, None], True)) == "recompute on"
    assert recompute_summary(_plan(small_cluster, [True, False], False)) == (
        "recompute on 1 of 2 stages"
    )
    assert recompute_summary(_plan(small_cluster, [None, False], True)) == (
        "recompute on 1 of 2 stages"
    )
