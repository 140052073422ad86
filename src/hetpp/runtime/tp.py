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
`whole` undoes it: `--verify` (`full_state`) and checkpoints (`GatheredStage`; `like` shards a
loaded tensor back) see the unsharded layout, so a checkpoint is a model state, not a layout.

The trainer calls `parallelize_stage` on every rank of a TP stage; `gradsync` reduces the
shards (`shard_dims`, `qkv_piece_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor
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
SPLIT_DIM = {ColwiseParallel: {"weight": 0, "bias": 0}, RowwiseParallel: {"weight": 1}}
"""Which dimension each style splits (a row-parallel bias is added whole, after the sum)."""


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


def whole(t: torch.Tensor, name: str, c: ModelConfig) -> torch.Tensor:
    """Parameter `name` of a block (or a tensor of its optimizer state, sharded alike) as the
    unsharded model holds it: a DTensor gathered (collective over its TP group), the q/k/v rows
    put back; a plain tensor as it is."""
    if not isinstance(t, DTensor):
        return t
    full = t.full_tensor()
    return full[torch.argsort(qkv_rows(c, t.device_mesh.size()))] if name in QKV else full


def like(p: torch.Tensor, name: str, value: torch.Tensor, c: ModelConfig) -> torch.Tensor:
    """`value`, in the unsharded model's layout, as parameter `p` (`name`) holds it: for a DTensor
    its rows permuted as `parallelize_stage` does and this rank's shard taken (no collective:
    every rank has the whole value); otherwise `value` itself. Inverse of `whole`."""
    if not isinstance(p, DTensor):
        return value
    if name in QKV:
        value = value[qkv_rows(c, p.device_mesh.size())]
    return distribute_tensor(value, p.device_mesh, p.placements, src_data_rank=None)


def full_state(stage: StageModule, grads: bool = False) -> dict[tuple[int, str], torch.Tensor]:
    """Every parameter (or, with `grads`, its gradient) of `stage` as the unsharded model holds
    it, keyed by (layer index, name) as `reference.stage_parameters` (tied copies included), on
    the CPU (collective over the TP group, `whole`)."""
    out = {}
    for i in range(stage.start, stage.end):
        for name, p in stage.layer(i).named_parameters(remove_duplicate=False):
            out[(i, name)] = whole(p.grad if grads else p, name, stage.config).detach().cpu()
    return out


class GatheredStage:
    """A TP stage's layers and optimizer state as the unsharded stage holds them (`whole`;
    built on every rank of the TP group, collective): what `checkpoint.save` reads of a stage
    (`config`, `own_parameters`) and of its optimizer (`state`), so a TP checkpoint is the same
    files as any other."""

    def __init__(self, stage: StageModule, opt: torch.optim.Optimizer):
        self.config = stage.config
        self.layers: dict[int, list[tuple[str, torch.Tensor]]] = {}
        self.state: dict[torch.Tensor, dict] = {}
        for i in range(stage.start, stage.end):
            self.layers[i] = []
            for name, p in stage.own_parameters(i):
                full = whole(p.detach(), name, self.config)
                self.layers[i].append((name, full))
                if p in opt.state:  # one order on every rank: the collectives match
                    self.state[full] = {
                        k: whole(v, name, self.config) if torch.is_tensor(v) else v
                        for k, v in opt.state[p].items()
                    }

    def own_parameters(self, index: int) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.layers[index])


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A TP rank's own part of `t` (its shard of a DTensor; a plain tensor as it is)."""
    return t.to_local() if isinstance(t, DTensor) else t


def shard_dims(stage: StageModule) -> dict[int, int]:
    """id(parameter) -> the dimension TP splits it along, for every parameter a TP group of any
    degree would split (the blocks' column/row-parallel weights, column-parallel biases), TP
    or not on this stage: owners of one gradient bucket with different degrees match pieces of
    them (`gradsync`). Parameters not listed are whole on every TP rank."""
    out = {}
    for layer in stage.layers.values():
        if not isinstance(layer, Block):
            continue
        modules = dict(layer.named_modules())
        for name, style in BLOCK_PLAN.items():
            for kind, dim in SPLIT_DIM[style].items():
                p = getattr(modules.get(name), kind, None)
                if p is not None:
                    out[id(p)] = dim
    return out


def qkv_piece_rows(
    stage: StageModule, tp: int, index: int
) -> dict[int, Callable[[int, int], torch.Tensor]]:
    """id(fused q/k/v weight or bias) -> rows(per, c): the rows of this rank's shard (TP rank
    `index` of `tp`) that hold piece `index * per + c` of the unsharded matrix cut into
    `tp * per` pieces in the degree-(tp * per) row order, in that order. Other owners of the
    bucket hold the same rows of the unsharded matrix in the same order (`gradsync`)."""
    c = stage.config
    n = c.q_dim + 2 * c.kv_heads * c.head_dim
    mine = torch.argsort(qkv_rows(c, tp)) - index * (n // tp)  # unsharded row -> local row

    def rows(per: int, piece: int) -> torch.Tensor:
        most = tp * per
        i = index * per + piece
        return mine[qkv_rows(c, most)[i * n // most : (i + 1) * n // most]]

    out = {}
    for layer in stage.layers.values():
        if isinstance(layer, Block):
            for name in QKV:
                p = dict(layer.named_parameters()).get(name)
                if p is not None:
                    out[id(p)] = rows
    return out
