"""How Llama-3.1-70B fits two pipelines on examples/a100-v100.yaml at 2 + 2 + 12/2 B.

    .venv/bin/python bench/zero1_70b_memory.py

The cost model's memory of single stages (`cost.memory.stage_memory`) of a 16-stage 1F1B
pipeline at micro-batch 1 with recomputation, sharded over 2 owners, half-precision parameters
with fp32 masters in the optimizer, the receive buffers charged as the runtime keeps them
(`cost.memory.recv_buffer_counts`: the in-flight micro-batches' activations and one gradient;
until branch recvbuf, one of each per micro-batch); then, for a few device mixes and
micro-batch counts, how
many of the model's layers a greedy packing covers (each stage takes layers while it fits, in
the stage order given; greedy is optimal for coverage in a fixed order since a stage's memory
grows with its range). A mix holds the model when it covers every layer.
"""

from __future__ import annotations

from hetpp.cost.compute import CostModel
from hetpp.cost.memory import stage_memory
from hetpp.specs import TrainSpec, load_cluster, load_model
from hetpp.specs.schedule import SCHEDULES

GB = 1e9
SHARDS = 2
STAGES = 16
A100, V100 = "A100-80GB", "V100-32GB"


def main() -> None:
    cluster = load_cluster("examples/a100-v100.yaml")
    model = load_model("examples/models/llama-3.1-70b.json", 4096)
    train = TrainSpec(global_batch=64, seq_len=4096, master_weights="optimizer", recompute=True)
    cm = CostModel(model, train, cluster)
    gpus = {d.gpu.name: d.gpu for d in cluster.devices}
    spec = SCHEDULES["1f1b"]
    layers = len(model.layers)

    def memory(gpu: str, s: int, start: int, end: int, m: int):
        k = spec.in_flight(s, STAGES, m)
        costs = cm.layer_costs(gpus[gpu], 1, True)
        return k, stage_memory(model, train, costs, start, end, k, m, SHARDS, spec)

    print(f"{model.total_params / 1e9:.2f} B parameters, {layers} layers, 2 + 2 + 12/{SHARDS} B")
    print("| device | stage | blocks | states | in-flight | buffers | transient | total | GB |")
    for gpu, s, blocks in ((V100, 15, 2), (V100, 15, 3), (V100, 9, 3), (A100, 4, 8), (A100, 0, 7)):
        k, mem = memory(gpu, s, 1, 1 + blocks, 32)
        states = mem.weights + mem.grads + mem.optimizer
        print(
            f"| {gpu} | {s} ({k} in flight) | {blocks} | {states / GB:.2f} | "
            f"{mem.activations / GB:.2f} | {mem.recv_buffers / GB:.2f} | {mem.transient / GB:.2f} "
            f"| {mem.total / GB:.2f} | {gpus[gpu].memory_bytes / GB:.0f} |"
        )

    def covered(order: list[str], m: int) -> int:
        start = 0
        for s, gpu in enumerate(order):
            end = start
            while end < layers and memory(gpu, s, start, end + 1, m)[1].total <= (
                gpus[gpu].memory_bytes
            ):
                end += 1
            start = end
        return start

    print(f"layers covered of {layers} (best of A100s first, V100s first):")
    for a, v in ((8, 8), (9, 7), (10, 6), (7, 9), (6, 10)):
        row = []
        for m in (4, 8, 16, 24, 32, 48, 60):
            got = max(covered([A100] * a + [V100] * v, m), covered([V100] * v + [A100] * a, m))
            row.append(f"m={m}: {got}")
        print(f"  {a} A100 + {v} V100: " + ", ".join(row))


if __name__ == "__main__":
    main()
