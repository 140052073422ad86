"""How long the simulator takes on a 1024-GPU plan with 64 micro-batches per pipeline.

    .venv/bin/python bench/sim_speed.py [--repeat 3]

The cluster is 64 nodes of 8 A100-80GB and 64 nodes of 8 V100-32GB; the plan (gpt3-6.7b, seq
2048, mbs 1, 1F1B, activation recomputation) has 32 mixed pipelines of 8 A100 + 8 V100 crossing
nodes and 32 pipelines of each type 8 deep inside a node: 96 pipelines, 1024 ranks, 64
micro-batches each. The time covers everything `hetpp simulate` does before printing: stage
costs, programs, engine, statistics.
"""

from __future__ import annotations

import argparse
import time

from simplans import split_layers

from hetpp.cost.compute import CostModel
from hetpp.cost.step import cost_model_for_plan
from hetpp.sim import simulate_plan
from hetpp.specs import PRESETS, Cluster, Plan, TrainSpec, load_model

MICRO_BATCHES = 64


def big_cluster() -> Cluster:
    return Cluster.model_validate(
        {
            "name": "a100-v100-1024",
            "nodes": [
                {"gpu": "A100-80GB", "gpus_per_node": 8, "count": 64, "intra_node_GBps": 300},
                {"gpu": "V100-32GB", "gpus_per_node": 8, "count": 64, "intra_node_GBps": 150},
            ],
            "inter_node_GBps": 25,
        }
    )


def big_plan() -> Plan:
    cluster = big_cluster()
    a100, v100 = list(range(512)), list(range(512, 1024))
    pipes = [a100[16 * i : 16 * i + 8] + v100[16 * i : 16 * i + 8] for i in range(32)]
    pipes += [a100[16 * i + 8 : 16 * i + 16] for i in range(32)]
    pipes += [v100[16 * i + 8 : 16 * i + 16] for i in range(32)]
    # recomputation keeps 16-deep 1F1B's first stages inside memory
    train = TrainSpec(global_batch=len(pipes) * MICRO_BATCHES, seq_len=2048, recompute=True)
    cm = CostModel(load_model("gpt3-6.7b", 2048), train, cluster)
    shapes: dict[tuple[str, ...], list[tuple[int, int]]] = {}
    pipelines = []
    for devs in pipes:
        key = tuple(cluster.gpu(d).name for d in devs)  # identical shapes split identically
        if key not in shapes:
            shapes[key] = split_layers(cm, devs, 1)
        stages = [{"devices": [d], "layers": list(r)} for d, r in zip(devs, shapes[key])]
        pipelines.append({"stages": stages, "micro_batch_size": 1, "num_micro_batches": 64})
    return Plan(
        global_batch=train.global_batch,
        seq_len=2048,
        model=PRESETS["gpt3-6.7b"],
        cluster=cluster,
        pipelines=pipelines,
        recompute=True,
    ).validate_plan()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    plan = big_plan()
    print(
        f"{plan.num_devices} ranks, {len(plan.pipelines)} pipelines, "
        f"{MICRO_BATCHES} micro-batches each"
    )
    times = []
    for _ in range(args.repeat):
        cm = cost_model_for_plan(plan)  # fresh: no cached layer costs between repeats
        t0 = time.perf_counter()
        res = simulate_plan(plan, cm)
        times.append(time.perf_counter() - t0)
    events = len(res.trace.rank) + len(res.trace.transfers.src)
    print(f"{events} intervals and transfers; iteration {res.iteration_time_s:.3f} s simulated")
    print(f"simulate_plan wall time: best {min(times):.2f} s, all {[round(t, 2) for t in times]}")


if __name__ == "__main__":
    main()
