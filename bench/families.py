"""Plan families side by side: which wins where, and by how much over the best plan without it.

    .venv/bin/python bench/families.py [--out docs/benchmarks-sharding-fsdp.md]

Four families plan the same model, batch and cluster, each on a fresh problem (`VARIANTS`):
pipelines (hpp's search with its baselines, every pipeline holding a whole replica), pipelines
with ZeRO-1 over the block owners (`--sharding auto`), pipelines with tensor parallelism inside a
stage (`--tp auto`), and heterogeneous FSDP. The table gives each one's predicted tokens/s per GPU
of the cluster, the winner and its gain over the best other column. The pipeline variants search
a superset of plain pipelines (each tries the unsharded / all-ones-degree plan too), so a ZeRO-1
or TP column equal to the pipelines column means the option did not help there.

The first scenario is torchtitan's published Llama 3 8B run (docs/performance.md: 64
A100-80GB, FSDP2, seq 8192, local batch 1 (global 64), selective layer activation
checkpointing: 2,904 tokens/s/GPU, 56.8% MFU); its row also gives hetpp's best against that.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from hetpp.planner import Problem, plan
from hetpp.specs import TrainSpec, load_cluster, load_model

ROOT = Path(__file__).parent.parent
TORCHTITAN_TOKENS_PER_S_PER_GPU = 2904.0
"""torchtitan docs/performance.md, Llama 3 8B, 64 A100-80GB, FSDP2, local batch 1, seq 8192,
selective layer activation checkpointing, 56.8% MFU."""

SCENARIOS = (
    ("bench/scenarios/a100-64.yaml", "llama3-8b", 8192, 64),
    ("examples/a100-v100.yaml", "llama3-8b", 8192, 64),
    ("bench/scenarios/h100-a100-t4.yaml", "llama3-8b", 4096, 128),
    ("bench/scenarios/4090-a6000.yaml", "llama3-8b", 4096, 64),
    ("examples/a100-v100.yaml", "examples/models/llama-3.1-70b.json", 4096, 64),
)
"""(cluster file, model, sequence length, global batch)."""

VARIANTS = {
    "pipelines": ("hpp", {}),
    "pipelines + ZeRO-1": ("hpp", {"sharding_mode": "auto"}),
    "pipelines + TP": ("hpp", {"tp_search": True}),
    "fsdp": ("fsdp", {}),
}
"""Column -> (strategy, Problem fields it sets)."""


def run(cluster_file: str, model: str, seq: int, batch: int) -> dict:
    cluster = load_cluster(ROOT / cluster_file)
    spec = load_model(str(ROOT / model) if model.endswith(".json") else model, seq)
    row: dict = {"cluster": cluster.name, "gpus": cluster.num_devices, "model": spec.name}
    row |= {"seq": seq, "batch": batch, "families": {}}
    base = Problem(spec, cluster, TrainSpec(global_batch=batch, seq_len=seq))
    for name, (strategy, fields) in VARIANTS.items():
        r = plan(replace(base, **fields), strategy)
        tokens = r.throughput_samples_per_s * seq / cluster.num_devices if r.feasible else 0.0
        row["families"][name] = (tokens, r)
    return row


def describe(r) -> str:
    """A plan in a few words: pipelines and depth, or devices and shares."""
    p = r.plan
    if p is None:
        return "none fits"
    used = p.num_devices
    rc = "recompute" if p.train.recompute else "no recompute"
    if p.sharding == "full":
        sizes = sorted({x.micro_batch_size for x in p.pipelines})
        m = p.pipelines[0].num_micro_batches
        return f"{used} GPUs, mbs {'/'.join(map(str, sizes))} x {m}, {rc}"
    depths = sorted({len(x.stages) for x in p.pipelines})
    extra = ", ZeRO-1" if p.sharding == "optimizer" else ""
    degrees = sorted({len(s.devices) for x in p.pipelines for s in x.stages} - {1})
    extra += f", TP {'/'.join(map(str, degrees))}" if degrees else ""
    return f"{len(p.pipelines)} pipelines, {'/'.join(map(str, depths))} stages, {rc}{extra}"


def table(rows: list[dict]) -> str:
    head = "| cluster | model, seq, batch | " + " | ".join(f"{f} tok/s/GPU" for f in VARIANTS)
    head += " | winner | gain over the best without it |\n"
    head += "|" + " --- |" * (len(VARIANTS) + 4) + "\n"
    lines = []
    for row in rows:
        fams = row["families"]
        ranked = sorted(fams, key=lambda f: -fams[f][0])
        win, second = ranked[0], ranked[1]
        gain = fams[win][0] / fams[second][0] if fams[second][0] else float("inf")
        cells = [f"{fams[f][0]:,.0f} ({describe(fams[f][1])})" for f in VARIANTS]
        lines.append(
            f"| {row['cluster']} ({row['gpus']} GPUs) | {row['model']}, {row['seq']}, "
            f"{row['batch']} | " + " | ".join(cells) + f" | {win} | {gain:.2f}x over {second} |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the table here (Markdown)")
    args = ap.parse_args()
    rows = [run(*s) for s in SCENARIOS]
    text = table(rows)
    best, titan = max(t for t, _ in rows[0]["families"].values()), TORCHTITAN_TOKENS_PER_S_PER_GPU
    cluster_file, model, seq, batch = SCENARIOS[0]
    spec, cluster = load_model(model, seq), load_cluster(ROOT / cluster_file)
    train = TrainSpec(global_batch=batch, seq_len=seq)
    full_rc = plan(Problem(spec, cluster, train, recompute_mode="on"), "fsdp")
    rc_tokens = full_rc.throughput_samples_per_s * seq / cluster.num_devices
    text += (
        f"\nLlama 3 8B on 64 A100-80GB: hetpp's best {best:,.0f} tokens/s/GPU, torchtitan "
        f"{titan:,.0f} ({best / titan - 1:+.1%}); fsdp with full recomputation "
        f"{rc_tokens:,.0f} ({rc_tokens / titan - 1:+.1%})\n"
    )
    print(text)
    if args.out:
        Path(args.out).write_text(f"    {' '.join(['.venv/bin/python', *sys.argv])}\n\n{text}")


if __name__ == "__main__":
    main()
