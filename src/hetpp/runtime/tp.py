"""Tensor parallelism inside a stage: Megatron-style column/row shards of every block (DTensor).

`parallelize_stage` splits each block of a `StageModule` over a 1-D DeviceMesh of the stage's TP
group with `torch.distributed.tensor.parallel`: the q/k/v projection and the MLP's gate/up
column-parallel (each rank computes whole heads and a slice of the MLP width), the attention
output and the MLP's down projection row-parallel (their partial sums all-reduced into the
replicated residual stream): two all-reduces per block forward and two in backward, what
`hetpp.cost.tp` charges. Norms, biases of row-parallel layers, the embedding and the head stay
whole on every rank. Each rank's attention then sees num_heads / k query and num_kv_heads / k KV
heads (the only bookkeeping of the model that changes).

hetpp's q/k/v projection is one fused matrix, rows [q | k | v]. A contiguous row split of it
would give rank 0 all of q and none of v, so its rows are first permuted into
[q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (rank j's query heads, then its KV heads, `qkv_rows`), and
`full_state` undoes it: checkpoints and `--verify` see the unsharded layout.

Not wired into the trainer yet (`runtime/contract.py` refuses TP stages): the pipeline P2P
between TP groups and the block-wise gradient sync over TP shards are still to be built.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from hetpp.runtime.model import Block, StageModule
from hetpp.specs.model import ModelConfig
from hetpp.specs.plan import tp_divisibility_error

BLOCK_PLAN = {
    "attn.qkv": ColwiseParallel,
    "attn.out": RowwiseParallel,
    "mlp.gate": ColwiseParallel,
    "mlp.up": ColwiseParallel,
    "mlp.down": RowwiseParallel,
}
"""Submodule -> its parallel style (`mlp.gate` only in gated MLPs)."""
QKV = ("attn.qkv.weight", "attn.qkv.bias")


def qkv_rows(c: ModelConfig, tp: int) -> torch.Tensor:
    """Row order of the fused q/k/v matrix that makes a contiguous split over `tp` ranks give
    rank j its own query heads, then its own KV heads (k, then v)."""
    q, kv = c.q_dim, c.kv_heads * c.head_dim
    qs, kvs = q // tp, kv // tp
    rows = [
        torch.cat(
            (
                torch.arange(j * qs, (j + 1) * qs),
                torch.arange(q + j * kvs, q + (j + 1) * kvs),
                torch.arange(q + kv + j * kvs, q + kv + (j + 1) * kvs),
            )
        )
        for j in range(tp)
    ]
    return torch.cat(rows)


def parallelize_stage(stage: StageModule, mesh: DeviceMesh) -> None:
    """Shard every block of `stage` over `mesh` (in place; identical weights on every rank
    first, as `StageModule` builds them from the seed)."""
    tp = mesh.size()
    why = tp_divisibility_error(stage.config, tp)
    if why:
        raise ValueError(f"tensor parallelism over {tp} ranks: {why}")
    rows = qkv_rows(stage.config, tp)
    for layer in stage.layers.values():
        if not isinstance(layer, Block):
            continue
        params, modules = dict(layer.named_parameters()), dict(layer.named_modules())
        with torch.no_grad():
            for name in QKV:
                if name in params:
                    params[name].copy_(params[name][rows])
        plan = {k: style() for k, style in BLOCK_PLAN.items() if k in modules}
        parallelize_module(layer, mesh, plan)
        layer.attn.heads //= tp
        layer.attn.kv_heads //= tp


def full_state(stage: StageModule, grads: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter (or, with `grads`, its gradient) of `stage` as the unsharded model holds
    it, keyed by `named_parameters` names: sharded ones gathered (collective over the TP group),
    the q/k/v rows put back in order."""
    out = {}
    rows: dict[int, torch.Tensor] = {}
    for name, p in stage.named_parameters():
        t = p.grad if grads else p
        t = t.full_tensor() if isinstance(t, DTensor) else t
        if name.endswith(QKV) and isinstance(p, DTensor):
            tp = p.device_mesh.size()
            order = rows.setdefault(tp, qkv_rows(stage.config, tp))
            t = t[torch.argsort(order)]
        out[name] = t.detach()
    return out
