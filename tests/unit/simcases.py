"""Plans with hand-chosen stage times for the simulator tests (imported by test_sim_*.py).

Two made-up GPU types get measured profiles with round numbers for tiny-llama (6 layers:
embedding, 4 blocks, head). A block takes 10 ms forward + 20 ms backward on `Fast` and twice that
on `Slow`; embedding and head take no time. So layers [0, 3) and [3, 6) each hold two blocks:
f = 20 ms, b = 40 ms on Fast; 40 and 80 ms on Slow.
"""

from __future__ import annotations

from hetpp.cost.compute import CostModel
from hetpp.cost.step import cost_model_for_plan
from hetpp.profile.table import ProfileRow, ProfileTable
from hetpp.specs import PRESETS, Cluster, Plan

SEQ = 128
ACT = {"embedding": 1_000, "block": 100_000, "head": 50_000}
"""Activation bytes a layer keeps per micro-batch (mbs 1)."""


def cluster(gpus_per_node: int = 2, nodes: int = 1) -> Cluster:
    """`nodes` nodes of Fast GPUs, then as many of Slow ones; 1 GB/s between nodes, no latency.
    By default devices 0, 1 are Fast (node 0) and 2, 3 Slow (node 1)."""
    return Cluster.model_validate(
        {
            "name": "fast-slow",
            "gpu_types": [
                {"name": "Fast", "bf16_tflops": 100, "memory_gb": 1, "mem_bw_GBps": 1000},
                {"name": "Slow", "bf16_tflops": 50, "memory_gb": 1, "mem_bw_GBps": 1000},
            ],
            "nodes": [
                {
                    "gpu": g,
                    "gpus_per_node": gpus_per_node,
                    "count": nodes,
                    "intra_node_GBps": 10_000,
                }
                for g in ("Fast", "Slow")
            ],
            "inter_node_GBps": 1,
            "inter_node_latency_us": 0,
            "intra_node_latency_us": 0,
        }
    )


def profiles() -> ProfileTable:
    rows = []
    for gpu, scale in (("Fast", 1.0), ("Slow", 2.0)):
        for kind in ("embedding", "block", "head"):
            f, b = (0.01, 0.02) if kind == "block" else (0.0, 0.0)
            rows.append(
                ProfileRow(gpu, "tiny-llama", SEQ, kind, 1, f * scale, b * scale, ACT[kind])
            )
    return ProfileTable(rows)


def plan(
    pipelines: list[tuple[list[tuple[int, tuple[int, int]]], int]],
    schedule: str = "1f1b",
    on: Cluster | None = None,
) -> Plan:
    """pipelines: ([(device, (start, end)), ...], num_micro_batches) each, micro-batch size 1."""
    return Plan(
        global_batch=sum(m for _, m in pipelines),
        seq_len=SEQ,
        schedule=schedule,
        model=PRESETS["tiny-llama"],
        cluster=on or cluster(),
        reserve_gb=0.1,
        pipelines=[
            {
                "stages": [{"devices": [d], "layers": list(r)} for d, r in stages],
                "micro_batch_size": 1,
                "num_micro_batches": m,
            }
            for stages, m in pipelines
        ],
    ).validate_plan()


def cost_model(p: Plan) -> CostModel:
    return cost_model_for_plan(p, profiles())
