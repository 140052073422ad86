"""Hand-shaped plans for the simulator benchmarks (no planner needed).

A plan here is: lists of device ids (one list per pipeline), a micro-batch size and a global
batch. Layers are split inside each pipeline to minimise the slowest stage (binary search on the
bottleneck, greedy fill), and micro-batches are split across pipelines in proportion to their
speed, as the planner's stage and data balance do, so the shapes are ones a planner could pick.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetpp.cost.compute import CostModel
from hetpp.cost.step import cost_model_for_plan, step_cost
from hetpp.specs import PRESETS, Cluster, Plan, TrainSpec, load_cluster, load_model
from hetpp.specs.schedule import SCHEDULES

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    """One benchmark plan and a short description of its shape."""

    name: str
    plan: Plan


def _fits(times: list[np.ndarray], bound: float) -> list[int] | None:
    """Greedy cuts giving every device at most `bound` seconds, or None if it cannot."""
    n_layers, cuts, start = len(times[0]), [0], 0
    for i, t in enumerate(times):
        left = len(times) - i - 1  # devices after this one need a layer each
        cum = np.cumsum(t[start:])
        take = int(np.searchsorted(cum, bound, side="right"))
        take = max(1, min(take, n_layers - start - left))
        start += take
        cuts.append(start)
    if start != n_layers:
        return None
    ok = all(
        t[a:b].sum() <= bound * (1 + 1e-9) for t, (a, b) in zip(times, itertools.pairwise(cuts))
    )
    return cuts if ok else None


def split_layers(cm: CostModel, devices: list[int], mbs: int) -> list[tuple[int, int]]:
    """Contiguous layer ranges minimising the slowest stage's forward + backward time."""
    times = []
    for d in devices:
        c = cm.layer_costs(cm.cluster.gpu(d), mbs)
        times.append(c.fwd_s + c.bwd_s)
    lo, hi = max(t.max() for t in times), sum(t.sum() for t in times)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _fits(times, mid) else (mid, hi)
    cuts = _fits(times, hi)
    assert cuts is not None
    return list(itertools.pairwise(cuts))


def _micro_batches(rates: list[float], total: int, minimum: list[int]) -> list[int]:
    """Integer split of `total` micro-batches in proportion to `rates`, each at least `minimum`."""
    if sum(minimum) > total:
        raise ValueError(f"{total} micro-batches cannot give each pipeline its minimum")
    share = np.array(rates) / sum(rates) * total
    m = np.maximum(np.floor(share).astype(int), minimum)
    while m.sum() < total:
        m[int(np.argmax(share - m))] += 1
    while m.sum() > total:
        over = np.where(m > minimum, m - share, -np.inf)
        m[int(np.argmax(over))] -= 1
    return [int(x) for x in m]


def make_plan(
    cluster: Cluster,
    model: str,
    pipelines: list[list[int]],
    mbs: int,
    global_batch: int,
    schedule: str = "1f1b",
    seq_len: int = 2048,
) -> Plan:
    """A plan with balanced stages and batch shares for the given device lists. Under a
    multi-chunk schedule each device runs two chunks, placed as the schedule says (zbh1: one)."""
    spec = SCHEDULES[schedule]
    chunks = 1 if spec.placement == "one" else 2
    train = TrainSpec(global_batch=global_batch, seq_len=seq_len, schedule=schedule)
    cm = CostModel(load_model(model, seq_len), train, cluster)
    pipes, rates = [], []
    for devs in pipelines:
        placed = [devs[spec.device_index(s, len(devs))] for s in range(chunks * len(devs))]
        if len(placed) > len(cm.model.layers):
            raise ValueError(f"{len(placed)} stages for {len(cm.model.layers)} layers")
        ranges = split_layers(cm, placed, mbs)
        pipes.append([{"devices": [d], "layers": list(r)} for d, r in zip(placed, ranges)])
        work = dict.fromkeys(devs, 0.0)
        for d, r in zip(placed, ranges):
            c = cm.layer_costs(cluster.gpu(d), mbs)
            work[d] += c.fwd(*r) + c.bwd(*r)
        rates.append(1 / max(work.values()))
    minimum = [spec.min_micro_batches(len(p)) for p in pipes]
    counts = _micro_batches(rates, global_batch // mbs, minimum)
    for i, devs in enumerate(pipelines):  # torch's rounds rule: the nearest valid count below
        while counts[i] > minimum[i] and spec.micro_batch_problem(
            len(pipes[i]), len(devs), counts[i]
        ):
            counts[i] -= 1
    return Plan(
        global_batch=mbs * sum(counts),
        seq_len=seq_len,
        schedule=schedule,
        model=PRESETS[model],
        cluster=cluster,
        pipelines=[
            {"stages": s, "micro_batch_size": mbs, "num_micro_batches": m}
            for s, m in zip(pipes, counts)
        ],
    ).validate_plan()


def chunks(devices: list[int], depth: int) -> list[list[int]]:
    """Consecutive groups of `depth` devices (whole pipelines only)."""
    return [devices[i : i + depth] for i in range(0, len(devices) - depth + 1, depth)]


def interleave(a: list[int], b: list[int], per_a: int, per_b: int) -> list[list[int]]:
    """Mixed pipelines: `per_a` devices of `a` followed by `per_b` of `b`, as many as fit."""
    n = min(len(a) // per_a, len(b) // per_b)
    return [a[i * per_a : (i + 1) * per_a] + b[i * per_b : (i + 1) * per_b] for i in range(n)]


def het3_cluster() -> Cluster:
    """8 H100 + 16 A100-40GB + 16 L40S (PCIe) in five nodes, 25 GB/s between nodes."""
    return Cluster.model_validate(
        {
            "name": "h100-a100-l40s",
            "nodes": [
                {"gpu": "H100-80GB", "gpus_per_node": 8, "intra_node_GBps": 450},
                {"gpu": "A100-40GB", "gpus_per_node": 8, "count": 2, "intra_node_GBps": 300},
                {"gpu": "L40S", "gpus_per_node": 8, "count": 2, "intra_node_GBps": 32},
            ],
            "inter_node_GBps": 25,
        }
    )


def slow_network(cluster: Cluster) -> Cluster:
    """The same nodes joined by 10 Gb/s Ethernet (1.25 GB/s), as in many mixed lab clusters."""
    return cluster.model_copy(update={"name": cluster.name + "-10gbe", "inter_node_GBps": 1.25})


RUNS = [(128, "1f1b"), (512, "1f1b"), (128, "gpipe")] + [
    (128, name) for name, spec in SCHEDULES.items() if spec.multi_stage
]
"""(global batch, schedule) of every shape."""


def cases() -> Iterator[Case]:
    """Varied shapes: homogeneous pipelines per GPU type at several depths, mixed pipelines
    crossing nodes, deep pipelines, three micro-batch sizes; 1F1B at two batches and GPipe, and
    every multi-stage schedule (two chunks per device; zbh1 one) at the smaller batch."""
    av = load_cluster(ROOT / "examples" / "a100-v100.yaml")
    a100, v100 = list(range(16)), list(range(16, 32))
    av10 = slow_network(av)
    het3 = het3_cluster()
    h100, a40, l40 = list(range(8)), list(range(8, 24)), list(range(24, 40))
    models = ["gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "llama2-7b", "llama2-13b"]
    # 4 pipelines of 2 H100 + 4 A100-40GB + 4 L40S, crossing three nodes each
    mixed3 = [
        h100[2 * i : 2 * i + 2] + a40[4 * i : 4 * i + 4] + l40[4 * i : 4 * i + 4] for i in range(4)
    ]
    shapes = {
        "av:type-d2/d4": (av, chunks(a100, 2) + chunks(v100, 4)),
        "av:type-d4/d8": (av, chunks(a100, 4) + chunks(v100, 8)),
        "av:mixed-2A+2V": (av, interleave(a100, v100, 2, 2)),
        "av:mixed-4A+4V-x-node": (av, interleave(a100[4:] + a100[:4], v100, 4, 4)),
        "av:deep-16": (av, [a100[4:12] + v100[:8]]),
        "av10g:type-d4/d8": (av10, chunks(a100, 4) + chunks(v100, 8)),
        "av10g:mixed-4A+4V-x-node": (av10, interleave(a100[4:] + a100[:4], v100, 4, 4)),
        "av10g:a100-d8-x-node": (av10, [a100[4:12], a100[12:] + a100[:4]]),
        "het3:type-d2/d4/d4": (het3, chunks(h100, 2) + chunks(a40, 4) + chunks(l40, 4)),
        "het3:mixed-H+A+L": (het3, mixed3),
    }
    for model in models:
        for shape, (cluster, pipes) in shapes.items():
            for mbs in (1, 2, 4):
                for batch, schedule in RUNS:
                    name = f"{model} {shape} mbs{mbs} B{batch} {schedule}"
                    try:
                        yield Case(name, make_plan(cluster, model, pipes, mbs, batch, schedule))
                    except ValueError:  # too few micro-batches (or layers) for this shape
                        continue


def fits(plan: Plan) -> bool:
    """Whether the cost model says every device holds its stage."""
    return step_cost(plan, cost_model_for_plan(plan)).fits
