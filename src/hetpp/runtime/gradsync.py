"""Block-wise gradient aggregation, the tied embedding/head weight, and global-norm clipping.

Layer l lives on a different rank in each pipeline, so one flat all-reduce cannot work. The plan's
gradient blocks each have one owner per pipeline; blocks with the same owning stage in every
pipeline form one bucket (`grad_buckets`: a rank running several chunks has a bucket per chunk),
flattened and all-reduced (SUM) over the owners, in the dtype the plan's `grad_bytes_per_param`
says (`Precision.reduce_dtype`; the gradients themselves stay in the parameters' dtype). The
loss is already divided by the global token count, so the sum is the full-batch mean gradient.

Overlap: a parameter's gradient is final once its stage's last backward has accumulated into it.
A rank may run several stages (model chunks) whose last backwards come at different times, so
completion is per stage: when a stage's last backward starts (`arm(stage)`), a hook on each of its
parameters counts the parameter as final as its gradient is accumulated; when that backward ends
(`finish(stage)`), every parameter of the stage is final. The hook covers full backwards; a
zero-bubble schedule's weight-grad action assigns `.grad` itself (torch's `stage_backward_weight`,
no accumulate hook fires), so there the stage's parameters become final together at `finish`,
right after its last weight-grad action. The bucket's all-reduce starts (asynchronously) once it
and every bucket before it in `grad_buckets` order (latest layers first, as backward finishes them)
are complete. Every rank issues its buckets in that one global order, the simulator's too: ranks
that share two reduce groups then never wait on each other's collectives in opposite orders (on
NCCL that could deadlock). Each bucket lies in one stage of this rank, and a rank finishes its
later chunks first under every schedule, so its buckets complete in that order; the price left:
a bucket complete on this rank may wait for an earlier one of the order still incomplete here.

With optimizer sharding (`Plan.sharding = "optimizer"`, `runtime.shard`) each bucket is
reduce-scattered instead: every owner keeps the summed gradient of its shard only, for the
optimizer to step; the all-gather of the updated parameters follows the optimizer step
(`ShardedStep.gather`, which overlaps them with the next step's forward).

Tensor parallelism: a TP rank's bucket holds its shards. A bucket's sharded gradients are cut
into K pieces, K the largest TP degree among its owners (powers of two), and piece i is
all-reduced over the one rank of each owner group that holds it (`RankMap.piece_groups`): the
same elements summed over the same pipelines as without TP, so the result is exact whatever the
degrees (a degree-1 owner takes part in all K). The fused q/k/v rows are matched by their place
in the unsharded matrix (`tp.qkv_rows`). Parameters every TP rank holds whole (norms, row-parallel
biases, embedding, head) have equal gradients on the ranks of a group: each rank sends 1/k of
them (exact: k is a power of two) in one all-reduce over every rank of the owner groups.

A tied weight is not in any bucket: every rank that holds it (the embedding's and the head's ranks
of all pipelines) sums its gradient once, after backward, which adds the embedding's and the head's
contributions together.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hetpp.runtime.groups import Groups, RankMap
from hetpp.runtime.model import RankModel
from hetpp.runtime.optim import (
    MasterWeights,
    clip_coefficient,
    grads_of,
    scale_grads,
    squared_norm,
)
from hetpp.runtime.shard import BucketShard, ShardedStep
from hetpp.runtime.tp import local_tensor, qkv_piece_rows, shard_dims
from hetpp.specs.plan import gather_order

Slice = tuple[torch.Tensor, int, torch.Tensor | None]
"""(gradient tensor, dim, indices along dim; None: the whole tensor) that a part reduces."""


@dataclass
class Part:
    """One all-reduce of a bucket: some slices of its gradients, flattened, over one group."""

    slices: list[Slice]
    ranks: tuple[int, ...]
    scale: float = 1.0
    flat: torch.Tensor | None = None
    work: dist.Work | None = field(default=None, repr=False)


@dataclass
class Bucket:
    """This rank's part of one gradient bucket, and its reduction in flight."""

    owners: tuple[int, ...]
    """Owner ranks, one per pipeline."""
    layers: tuple[tuple[int, int], ...]
    """Layer ranges of the merged blocks."""
    params: list[torch.nn.Parameter]
    """This rank's parameters of those layers, in layer order (the same order on every owner)."""
    pieces: tuple[tuple[int, ...], ...] = ()
    """Ranks holding each piece of the sharded gradients (`RankMap.piece_groups`)."""
    waiting: int = 0
    """Parameters whose final gradient has not arrived yet in this step."""
    shard: BucketShard | None = None
    """Sharded: the bucket's flat layout over its owners and this rank's pieces."""
    flat: torch.Tensor | None = None
    """Sharded, in flight: this rank's shard of the flat sum."""
    work: dist.Work | None = field(default=None, repr=False)
    parts: list[Part] = field(default_factory=list)
    """In flight, unsharded: this rank's all-reduces of the bucket (one without TP)."""

    def describe(self) -> str:
        spans = ", ".join(f"[{a}, {b})" for a, b in self.layers)
        return f"gradient sync of layers {spans} with ranks {list(self.owners)}"


class GradSync:
    """This rank's share of the gradient reductions of a plan."""

    def __init__(self, ranks: RankMap, rank: int, model: RankModel, groups: Groups,
                 device: torch.device, reduce_dtype: torch.dtype,
                 sharded: bool = False):  # fmt: skip
        self.groups, self.device, self.reduce_dtype = groups, device, reduce_dtype
        self.ranks, self.role = ranks, ranks.role(rank)
        tp, index = len(self.role.tp_ranks), self.role.tp_index
        self.dims: dict[int, int] = {}
        self.qkv_rows: dict = {}
        for st in model.stages:  # a TP rank runs one stage; a plain one may run several
            self.dims.update(shard_dims(st))
            self.qkv_rows.update(qkv_piece_rows(st, tp, index))
        tied = model.tied_weight()
        self.buckets: list[Bucket] = []
        # Counted once for the norm: a block's grad is the same on all its owners after the sync,
        # so only pipeline 0's owner adds it in (the tied weight with layer 0); in a TP group
        # each rank its shards, rank 0 what every rank holds whole.
        self.norm_params: list[torch.nn.Parameter] = []
        self.stage_params: list[list[tuple[torch.nn.Parameter, Bucket]]] = [
            [] for _ in model.stages
        ]
        """Per local stage: its parameters that are in a bucket, with their bucket."""
        for layers, owners in ranks.buckets:
            if rank not in ranks.union(owners):  # a TP rank: its group owns the bucket
                continue
            params = [
                (i, p) for a, b in layers for i in range(a, b) for _, p in model.own_parameters(i)
            ]
            if rank in ranks.role(owners[0]).tp_ranks:  # a TP group counts each shard once
                lead = self.role.tp_index == 0
                self.norm_params += [p for _, p in params if lead or id(p) in self.dims]
            params = [(i, p) for i, p in params if p is not tied]
            if len(owners) > 1 and params:  # a bucket can hold just the tied weight: nothing left
                own = [p for _, p in params]
                shard = BucketShard(own, owners, rank) if sharded else None
                bucket = Bucket(owners, layers, own, ranks.piece_groups(owners), shard=shard)
                self.buckets.append(bucket)
                for i, p in params:
                    stage = model.holder(i)
                    self.stage_params[stage].append((p, bucket))
                    p.register_post_accumulate_grad_hook(
                        lambda p, s=stage, b=bucket: self._arrived(p, s, b)
                    )
        self.sharded: ShardedStep | None = None
        """Sharded plans: this rank's shards, which the optimizer steps."""
        if sharded:  # all-gathered in forward order, each read by the stages holding its layers
            ahead = gather_order(self.buckets, lambda b: b.layers)
            self.sharded = ShardedStep(
                [(b.shard, groups.reduce_group(b.owners)) for b in ahead],
                [[model.stages[k] for k in {model.holder(a) for a, _ in b.layers}] for b in ahead],
            )
        holders = ranks.tied
        self.tied = tied if tied is not None and len(holders) > 1 else None
        self.tied_holders = holders
        self._reset()

    def _reset(self) -> None:
        self.armed: set[int] = set()
        """Local stages whose last backward of this step has started."""
        self.final: set[int] = set()
        """Ids of the parameters whose gradient is final this step."""
        self.issued = 0
        """Buckets started this step (in `grad_buckets` order)."""
        for b in self.buckets:
            b.waiting, b.flat, b.work, b.parts = len(b.params), None, None, []

    def arm(self, stage: int) -> None:
        """Local stage `stage` starts its last backward of the step: from now on, its parameters'
        accumulated gradients are final."""
        self.armed.add(stage)

    def finish(self, stage: int) -> None:
        """Local stage `stage`'s last backward (or weight-grad action) has returned: all of its
        parameters are final, those no hook announced included (a weight-grad action assigns
        `.grad` without one; a parameter can take no part in the forward)."""
        for p, bucket in self.stage_params[stage]:
            self._final(p, bucket)
        self._issue_ready()

    def _arrived(self, p: torch.nn.Parameter, stage: int, bucket: Bucket) -> None:
        if stage in self.armed:
            self._final(p, bucket)
            self._issue_ready()

    def _final(self, p: torch.nn.Parameter, bucket: Bucket) -> None:
        if id(p) not in self.final:
            self.final.add(id(p))
            bucket.waiting -= 1

    def _issue_ready(self) -> None:
        """Start the complete buckets, strictly in `grad_buckets` order: NCCL collectives on
        overlapping groups issued in different orders on different ranks can deadlock."""
        while self.issued < len(self.buckets) and self.buckets[self.issued].waiting == 0:
            self._start(self.buckets[self.issued])
            self.issued += 1

    def _start(self, b: Bucket) -> None:
        if b.shard is not None:  # sharded plans have no TP stages (`runtime/contract.py`)
            group = self.groups.reduce_group(b.owners)
            flat = b.shard.flat(grads_of(b.params), self.reduce_dtype)
            b.flat = flat.new_empty(b.shard.size)
            b.work = dist.reduce_scatter_single(b.flat, flat, group=group, async_op=True)
            return
        b.parts = self._parts(b)
        for part in b.parts:
            flat = torch.cat([_take(s).reshape(-1) for s in part.slices]).to(self.reduce_dtype)
            part.flat = flat if part.scale == 1.0 else flat * part.scale
            group = self.groups.reduce_group(part.ranks)
            part.work = dist.all_reduce(part.flat, group=group, async_op=True)

    def _parts(self, b: Bucket) -> list[Part]:
        """This rank's all-reduces of bucket `b`, in the one order every rank issues them."""
        grads = [local_tensor(g) for g in grads_of(b.params)]
        if len(b.pieces) == 1:
            return [Part([(g, 0, None) for g in grads], b.owners)]
        k, j = len(self.role.tp_ranks), self.role.tp_index
        per = len(b.pieces) // k  # pieces this rank holds: [j * per, (j + 1) * per)
        sharded = [(p, g) for p, g in zip(b.params, grads) if id(p) in self.dims]
        whole = [(g, 0, None) for p, g in zip(b.params, grads) if id(p) not in self.dims]
        parts = [
            Part([self._piece(p, g, per, c) for p, g in sharded], b.pieces[j * per + c])
            for c in range(per)
        ]
        if whole:
            parts.append(Part(whole, self.ranks.union(b.owners), 1.0 / k))
        return parts

    def _piece(self, p: torch.nn.Parameter, g: torch.Tensor, per: int, c: int) -> Slice:
        """Piece c of `per` of this rank's shard `g` of `p`: a contiguous run along the shard
        dimension, or for the fused q/k/v the rows the unsharded matrix's piece holds."""
        dim = self.dims[id(p)]
        size = g.shape[dim] // per
        rows = self.qkv_rows.get(id(p))
        idx = rows(per, c) if rows else torch.arange(c * size, (c + 1) * size)
        return g, dim, idx.to(g.device)

    def sync(self, note: Callable[[str], None]) -> None:
        """Finish the step's reductions: start what backward has not (the tied weight; a bucket
        with a parameter that got no gradient), then wait for all and copy the sums back. `note`
        is told which reduction is being waited for (failure messages name it)."""
        for b in self.buckets[self.issued :]:
            self._start(b)
        tied_work = tied_flat = None
        if self.tied is not None:
            group = self.groups.reduce_group(self.tied_holders)
            tied_flat = grads_of([self.tied])[0].to(self.reduce_dtype)  # the grad itself if equal
            if len(self.role.tp_ranks) > 1:  # each rank of a TP group holds it: 1/k from each
                tied_flat = tied_flat / len(self.role.tp_ranks)
            tied_work = dist.all_reduce(tied_flat, group=group, async_op=True)
        for b in self.buckets:
            note(b.describe())
            if b.shard is not None:
                b.work.wait()
                b.shard.scatter_grads(b.flat)
                b.flat = b.work = None
                continue
            for part in b.parts:
                part.work.wait()
                sizes = [_numel(s) for s in part.slices]
                for sl, chunk in zip(part.slices, part.flat.split(sizes)):
                    _put(sl, chunk)
            b.parts = []
        if tied_work is not None:
            note(f"tied-weight sync with ranks {list(self.tied_holders)}")
            tied_work.wait()
            self.tied.grad.copy_(tied_flat)
        self._reset()

    def clip(
        self, max_norm: float, stage: RankModel, masters: MasterWeights | None = None
    ) -> float:
        """Scale all grads so the global L2 norm is at most `max_norm`; returns the norm before.
        Sharded: every owner adds its shards' squares (each element is on one owner), and the
        unsharded parameters count on pipeline 0's owner as before: the same norm, exactly.
        With fp32 masters of half-precision parameters, their gradients are measured and
        scaled instead (one per counted parameter or piece)."""
        params = self.norm_params
        pieces = []
        if self.sharded is not None:
            params = [p for p in params if p not in self.sharded.sharded]
            pieces = [piece.view for piece in self.sharded.pieces()]
        counted, scaled = params + pieces, [*stage.parameters(), *pieces]
        if masters is not None:
            counted, scaled = masters.of(counted), masters.params
        local = squared_norm(counted, self.device)
        dist.all_reduce(local)
        norm = math.sqrt(local.item())
        scale_grads(scaled, clip_coefficient(norm, max_norm))
        return norm


def _take(s: Slice) -> torch.Tensor:
    g, dim, idx = s
    return g if idx is None else g.index_select(dim, idx)


def _numel(s: Slice) -> int:
    g, dim, idx = s
    return g.numel() if idx is None else g.numel() // g.shape[dim] * len(idx)


def _put(s: Slice, values: torch.Tensor) -> None:
    g, dim, idx = s
    if idx is None:
        g.copy_(values.view_as(g))
    else:
        shape = list(g.shape)
        shape[dim] = len(idx)
        g.index_copy_(dim, idx, values.view(shape).to(g.dtype))
