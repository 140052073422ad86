"""Shared builders and hypothesis strategies for the planner tests."""

from __future__ import annotations

from hypothesis import strategies as st

from hetpp.planner import Problem
from hetpp.specs import Cluster, GpuType, NodeGroup, TrainSpec, load_model
from hetpp.specs.model import ModelConfig, ModelSpec

CATALOG_TYPES = ["A100-80GB", "A100-40GB", "RTX-4090", "V100-16GB", "T4", "H100-80GB", "L4"]


def cluster(*groups: tuple[str, int, int], inter: float = 25.0, **kw) -> Cluster:
    """Cluster from (gpu, gpus_per_node, count) triples (intra-node 100 GB/s)."""
    return Cluster(
        nodes=[
            NodeGroup(gpu=g, gpus_per_node=n, count=c, intra_node_GBps=100.0) for g, n, c in groups
        ],
        inter_node_GBps=inter,
        **kw,
    )


def problem(cl: Cluster, model: str | ModelSpec, batch: int, seq: int = 1024, **kw) -> Problem:
    spec = model if isinstance(model, ModelSpec) else load_model(model, seq)
    return Problem(spec, cl, TrainSpec(global_batch=batch, seq_len=spec.seq_len), **kw)


def block_problem(
    cl: Cluster, model: str | ModelSpec, batch: int, seq: int = 1024, **kw
) -> Problem:
    """`problem` with whole-block stages only (`Problem.half_blocks` False): for tests of the
    passes before the half-block pass, which take the search's plans at block units."""
    return problem(cl, model, batch, seq, half_blocks=False, **kw)


def small_model(layers: int, hidden: int, seq: int = 512) -> ModelSpec:
    """A GPT of the given size (vocab 8192), for memory-tight custom GPUs."""
    cfg = ModelConfig(
        name=f"gpt-{layers}x{hidden}",
        family="gpt",
        vocab_size=8192,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=8,
        ffn_hidden_size=4 * hidden,
        max_seq_len=seq,
    )
    return ModelSpec(config=cfg, seq_len=seq)


@st.composite
def small_problems(draw, max_devices: int = 8) -> Problem:
    """Random clusters of 1..max_devices GPUs (1-3 node groups, catalog or custom types with
    little memory), random models and batches: memory is often short, so shapes matter."""
    custom = draw(st.booleans())
    groups, types, left = [], [], max_devices
    for i in range(draw(st.integers(1, 3))):
        if left <= 0:
            break
        per_node = draw(st.sampled_from([1, 2, 4]))
        per_node = min(per_node, left)
        count = draw(st.integers(1, max(1, min(2, left // per_node))))
        left -= per_node * count
        if custom:
            name = f"g{i}"
            types.append(
                GpuType(
                    name=name,
                    bf16_tflops=draw(st.sampled_from([20.0, 60.0, 150.0, 400.0])),
                    memory_gb=draw(st.sampled_from([2.5, 4.0, 8.0, 16.0])),
                    mem_bw_GBps=draw(st.sampled_from([300.0, 900.0, 2000.0])),
                )
            )
        else:
            name = draw(st.sampled_from(CATALOG_TYPES))
        intra = draw(st.sampled_from([32.0, 300.0]))
        groups.append(
            NodeGroup(gpu=name, gpus_per_node=per_node, count=count, intra_node_GBps=intra)
        )
    cl = Cluster(
        nodes=groups, gpu_types=types, inter_node_GBps=draw(st.sampled_from([5.0, 25.0, 100.0]))
    )
    if custom:
        spec = small_model(draw(st.integers(2, 12)), draw(st.sampled_from([256, 512, 1024])))
    else:
        name, seq = draw(st.sampled_from([("gpt3-350m", 1024), ("gpt3-1.3b", 2048)]))
        spec = load_model(name, seq)
    batch = draw(st.sampled_from([4, 8, 16, 32, 64]))
    schedule = draw(st.sampled_from(["1f1b", "1f1b", "gpipe"]))
    recompute = draw(st.sampled_from(["auto", "off"]))
    return Problem(
        spec,
        cl,
        TrainSpec(global_batch=batch, seq_len=spec.seq_len, schedule=schedule),
        micro_batch_sizes=(1, 2, 4),
        recompute_mode=recompute,
    )
