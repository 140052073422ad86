"""hetpp's predicted throughput for homogeneous clusters beside published measurements.

    .venv/bin/python bench/published.py

Each row is one published training run: model, GPU type and count, sequence length, micro-batch
size and gradient accumulation, activation recomputation, and the tokens per second per GPU the
authors measured. hetpp predicts the same run as a plan of one-stage pipelines, one per GPU, each
with the run's micro-batch size and accumulation count (data parallelism), costed by
`cost.step.step_cost`: compute from the estimator, the gradient all-reduce that sticks out past
the backward, the optimizer step. The published runs shard with FSDP (ZeRO-3) or, for Megatron,
replicate; hetpp cannot shard yet, so its prediction stands for the same compute with replicated
states (memory is not checked: FSDP is what makes these runs fit) and an all-reduce where FSDP
does a reduce-scatter plus all-gathers it overlaps with compute.

Sources (each row names one):
- llm-foundry: MosaicML, "MPT Training Benchmarks", scripts/train/benchmarking/README.md,
  https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md
  (tables "A100 80GB with 1600 Gbps node-node interconnect (RoCE)" and "H100 80GB BF16"); MPT
  architecture from scripts/train/yamls/pretrain/mpt-*.yaml (vocab 50368, expansion 4, no
  biases, tied embeddings, learned positions: the tables' parameter counts grow with seq len).
- torchtitan: PyTorch, "Performance" (docs/performance.md),
  https://github.com/pytorch/torchtitan/blob/main/docs/performance.md
- Megatron-LM: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", SC21, arXiv 2104.04473, Table 1 (FLOP/s per GPU converted to tokens/s
  with the paper's own FLOP count, eq. 3, which includes the recomputed forward).
"""

from __future__ import annotations

import argparse
import statistics
from typing import NamedTuple

from hetpp.cost.step import cost_model_for_plan, step_cost
from hetpp.specs import CATALOG, PRESETS, Cluster, ModelConfig, Plan, TrainSpec

LLM_FOUNDRY = "llm-foundry MPT benchmarks"
TORCHTITAN = "torchtitan performance.md"
MEGATRON = "Megatron-LM SC21 Table 1"
NVLINK_GBPS = {"A100-80GB": 300.0, "H100-80GB": 450.0, "H100-96GB-500W": 450.0}
"""NVLink per direction inside an 8-GPU node (A100 SXM: 600 GB/s total; H100 SXM: 900)."""
TORCHTITAN_H100 = CATALOG["h100-80gb"].model_copy(
    update={"name": "H100-96GB-500W", "memory_gb": 96, "mem_bw_GBps": 2400}
)
"""torchtitan's Grand Teton H100: 96 GB HBM2e at 2.4 TB/s, at a 500 W power limit (not modelled:
the catalog H100's peak and transfer)."""


def gpt(name: str, hidden: int, heads: int, layers: int, **changes) -> ModelConfig:
    """A GPT-3-style config (GELU MLP 4h, tied embeddings, learned positions, seq 2048)."""
    shape = dict(hidden_size=hidden, num_heads=heads, num_layers=layers, ffn_hidden_size=4 * hidden)
    return PRESETS["gpt3-1.3b"].model_copy(update={"name": name, **shape, **changes})


def mpt(size: str, hidden: int, heads: int, layers: int) -> ModelConfig:
    """MPT as llm-foundry's yamls configure it: vocabulary 50368, no biases."""
    no_bias = dict(vocab_size=50368, qkv_bias=False, dense_bias=False)
    return gpt(f"mpt-{size}", hidden, heads, layers, **no_bias)


MEGATRON_1_7B = gpt("gpt-1.7b", 2304, 24, 24, vocab_size=51200)


class Run(NamedTuple):
    """One published measurement and the settings it was made with."""

    source: str
    model: ModelConfig
    gpu: str
    gpus: int
    seq_len: int
    mbs: int
    grad_accum: int
    recompute: bool
    tokens_per_s_per_gpu: float
    """As published."""
    settings: str
    """What else the source states about the run."""


FSDP_BF16 = "bf16 (amp), FSDP FULL_SHARD, no activation checkpointing"
RUNS = (
    Run(
        LLM_FOUNDRY, mpt("350m", 1024, 16, 24), "A100-80GB", 8, 2048, 32, 2, False, 58782, FSDP_BF16
    ),
    Run(
        LLM_FOUNDRY, mpt("760m", 1536, 12, 24), "A100-80GB", 8, 2048, 24, 2, False, 32434, FSDP_BF16
    ),
    Run(LLM_FOUNDRY, mpt("1b", 2048, 16, 24), "A100-80GB", 8, 2048, 14, 4, False, 20513, FSDP_BF16),
    Run(LLM_FOUNDRY, mpt("3b", 2560, 20, 32), "A100-80GB", 8, 2048, 10, 2, False, 10811, FSDP_BF16),
    Run(LLM_FOUNDRY, mpt("7b", 4096, 32, 32), "A100-80GB", 8, 2048, 6, 2, False, 4641, FSDP_BF16),
    Run(LLM_FOUNDRY, mpt("13b", 5120, 40, 40), "A100-80GB", 8, 2048, 2, 3, False, 2262, FSDP_BF16),
    Run(
        LLM_FOUNDRY, mpt("760m", 1536, 12, 24), "H100-80GB", 8, 2048, 24, 2, False, 63147, FSDP_BF16
    ),
    Run(LLM_FOUNDRY, mpt("1b", 2048, 16, 24), "H100-80GB", 8, 2048, 14, 1, False, 45455, FSDP_BF16),
    Run(LLM_FOUNDRY, mpt("7b", 4096, 32, 32), "H100-80GB", 8, 2048, 6, 1, False, 10643, FSDP_BF16),
    Run(LLM_FOUNDRY, mpt("13b", 5120, 40, 40), "H100-80GB", 8, 2048, 2, 1, False, 4792, FSDP_BF16),
    Run(
        TORCHTITAN,
        PRESETS["llama3-8b"],
        "A100-80GB",
        64,
        8192,
        1,
        1,
        False,
        2973,
        "bf16, FSDP2, local batch 1, selective (op) activation checkpointing, 58.2% MFU",
    ),
    Run(
        TORCHTITAN,
        PRESETS["llama3-8b"],
        "H100-96GB-500W",
        8,
        8192,
        2,
        1,
        False,
        5762,
        "Llama 3.1 8B, bf16, FSDP2 without torch.compile, local batch 2, selective activation "
        "checkpointing; 96 GB HBM2e H100 at a 500 W limit",
    ),
    Run(
        MEGATRON,
        MEGATRON_1_7B,
        "A100-80GB",
        32,
        2048,
        4,
        4,
        True,
        9287,
        "137 TFLOP/s per GPU (44% of peak), fp16, TP 1, PP 1, DP 32, batch 512, activation "
        "recomputation; micro-batch size not stated (4 assumed); tokens/s from eq. 3",
    ),
)


def cluster_for(run: Run) -> Cluster:
    per_node = min(run.gpus, 8)
    return Cluster.model_validate(
        {
            "name": f"{run.gpus}x{run.gpu}",
            "gpu_types": [TORCHTITAN_H100.model_dump()] if run.gpu == TORCHTITAN_H100.name else [],
            "nodes": [
                {
                    "gpu": run.gpu,
                    "gpus_per_node": per_node,
                    "count": run.gpus // per_node,
                    "intra_node_GBps": NVLINK_GBPS[run.gpu],
                }
            ],
            # 200-400 Gb/s per GPU (RoCE / InfiniBand) on every cluster here.
            "inter_node_GBps": 25.0,
        }
    )


def data_parallel_plan(run: Run) -> Plan:
    """One one-stage pipeline per GPU, each with the run's micro-batches."""
    pipe = {"micro_batch_size": run.mbs, "num_micro_batches": run.grad_accum}
    layers = [0, run.model.num_layers + 2]
    pipelines = [{**pipe, "stages": [{"devices": [d], "layers": layers}]} for d in range(run.gpus)]
    train = TrainSpec(
        global_batch=run.gpus * run.mbs * run.grad_accum,
        seq_len=run.seq_len,
        precision="bf16",
        recompute=run.recompute,
    )
    return Plan(train=train, model=run.model, cluster=cluster_for(run), pipelines=pipelines)


def predicted_tokens_per_s_per_gpu(run: Run) -> float:
    plan = data_parallel_plan(run).validate_plan()
    cost = step_cost(plan, cost_model_for_plan(plan))
    return plan.global_batch * plan.seq_len / cost.iteration_time_s / run.gpus


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(
        f"{'source':28s} {'model':10s} {'GPU':15s} {'GPUs':>4s} {'seq':>5s} {'mbs':>3s} "
        f"{'published':>9s} {'hetpp':>7s} {'error':>6s}"
    )
    errors: dict[str, list[float]] = {}
    for run in RUNS:
        pred = predicted_tokens_per_s_per_gpu(run)
        err = pred / run.tokens_per_s_per_gpu - 1
        errors.setdefault(run.gpu, []).append(err)
        print(
            f"{run.source:28s} {run.model.name:10s} {run.gpu:15s} {run.gpus:4d} {run.seq_len:5d} "
            f"{run.mbs:3d} {run.tokens_per_s_per_gpu:9.0f} {pred:7.0f} {err:+6.1%}"
        )
    for gpu, errs in errors.items():
        within = sum(abs(e) <= (0.10 if gpu.startswith("A100") else 0.15) for e in errs)
        print(
            f"{gpu}: median |error| {statistics.median(abs(e) for e in errs):.1%}, "
            f"{within} of {len(errs)} within {'10' if gpu.startswith('A100') else '15'}%"
        )


if __name__ == "__main__":
    main()
