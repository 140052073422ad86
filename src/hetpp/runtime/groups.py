"""Who runs what: rank <-> plan device, each rank's pipeline and stages, and the process groups.

Ranks are the plan's device ids in increasing order, so a plan over devices 0..N-1 runs rank r on
device r. A tensor-parallel stage of k devices is k ranks (its TP group). As torchtitan combines
PP and TP, a pipeline runs as lanes: with K the largest degree of its stages, lane L holds TP rank
L * k // K of each stage of degree k (a rank of a narrower stage is in K / k lanes), and every
rank runs the pipeline schedule as stage s of its first lane. Activations between stages are
replicated over a TP group (after the row-parallel reduction), as are the gradients sent back, so
each receiver takes them from one rank of the neighbouring stage and a sender sends to every
rank that takes them from it (`Link`, `runtime/lanes.py`): degrees may change along a pipeline.
`RankMap` works this out once from the plan; everything else asks it. `dist.new_group` is
collective over the whole world, so every rank creates every group, in one order computed from
the plan alone.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from hetpp.specs.errors import SpecError
from hetpp.specs.plan import Plan, grad_buckets


@dataclass(frozen=True)
class Link:
    """Who a TP pipeline's rank exchanges activations and gradients with at a neighbouring stage
    (their values are replicated over each TP group): TP rank j of a stage of degree k receives
    from TP rank j * k' // k of its neighbour of degree k', and sends to every rank t of it with
    t * k // k' == j (one rank each way when the degrees agree; several, or none, where they
    change)."""

    stage: int
    """The neighbouring stage (this rank's stage plus or minus one)."""
    source: int
    """The rank this one receives from (activations from the stage before, gradients from the
    one after)."""
    targets: tuple[int, ...]
    """The ranks this one sends to."""


def links(groups: list[tuple[int, ...]], s: int, j: int) -> tuple[Link, ...]:
    """The links of TP rank `j` of stage `s` of a pipeline whose stages run on `groups` (ranks)."""
    k, out = len(groups[s]), []
    for n in (s - 1, s + 1):
        if 0 <= n < len(groups):
            peer = groups[n]
            targets = tuple(r for t, r in enumerate(peer) if t * k // len(peer) == j)
            out.append(Link(n, peer[j * len(peer) // k], targets))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class Role:
    """One rank's place in the plan."""

    rank: int
    """Global rank in the process group."""
    device: int
    """The plan's (cluster) device id this rank plays."""
    pipeline: int
    """Index of the pipeline the rank belongs to."""
    stages: tuple[int, ...]
    """Indices of the stages the rank runs, in pipeline order (one, or several model chunks
    under an interleaved or V-shaped schedule)."""
    num_stages: int
    """Stages in that pipeline (every chunk counted)."""
    layers: tuple[tuple[int, int], ...]
    """Layer range [start, end) of each of `stages`."""

    @property
    def first(self) -> bool:
        """Whether the rank runs the pipeline's first stage (it feeds the inputs)."""
        return self.stages[0] == 0

    @property
    def last(self) -> bool:
        """Whether the rank runs the pipeline's last stage (it computes the loss)."""
        return self.stages[-1] == self.num_stages - 1

    tp_ranks: tuple[int, ...]
    """Ranks of the stage's TP group in group order (this rank alone without TP; a TP rank
    runs one stage, `runtime/contract.py`)."""
    chain: tuple[int, ...]
    """Ranks that run the pipeline schedule with this one, group rank i the pipeline's device i
    (the pipeline's ranks without TP; with TP, this rank's first lane)."""
    links: tuple[Link, ...] = ()
    """In a pipeline with TP stages, whom it exchanges activations and gradients with (empty
    without TP: the schedule's own peers, `chain`)."""
    p2p: tuple[int, ...] = ()
    """In a pipeline with TP stages, every rank of it (sorted): the group its P2P crosses."""

    @property
    def tp_index(self) -> int:
        return self.tp_ranks.index(self.rank)


BucketRanks = tuple[tuple[tuple[int, int], ...], tuple[int, ...]]
"""(layer ranges, owner ranks in pipeline order) of one gradient bucket."""


@dataclass(frozen=True, kw_only=True)
class RankMap:
    """Every rank's role and the rank sets of a plan, computed once (`RankMap.of`)."""

    devices: tuple[int, ...]
    """The plan's devices in rank order (rank r plays devices[r])."""
    roles: tuple[Role, ...]
    """Role of each rank."""
    pipelines: tuple[tuple[int, ...], ...]
    """Each pipeline's ranks in the order of their first stage (group rank i runs stages the
    schedule's placement gives device i)."""
    buckets: tuple[BucketRanks, ...]
    """Every gradient bucket in the order all ranks issue their all-reduces (`grad_buckets`:
    latest layers first, as the simulator has it)."""
    tied: tuple[int, ...]
    """Ranks holding the embedding or the head of a tied model (each holds the tied weight);
    empty when untied."""
    tp_groups: tuple[tuple[int, ...], ...]
    """Every TP group of more than one rank (stage order, pipeline by pipeline)."""
    chains: tuple[tuple[int, ...], ...]
    """Every lane of ranks that runs a pipeline schedule (`Role.chain`)."""

    @classmethod
    def of(cls, plan: Plan) -> RankMap:
        devices = tuple(sorted({d for p in plan.pipelines for s in p.stages for d in s.devices}))
        rank = {d: r for r, d in enumerate(devices)}
        owned: dict[int, list[int]] = {}
        for pipe in plan.pipelines:
            for s, st in enumerate(pipe.stages):
                for d in st.devices:
                    owned.setdefault(rank[d], []).append(s)
        roles: list[Role | None] = [None] * len(devices)
        chains = []
        for p, pipe in enumerate(plan.pipelines):
            groups = [tuple(rank[d] for d in st.devices) for st in pipe.stages]
            most = max(len(g) for g in groups)
            # lane L: TP rank L * k // K of every stage; without TP, the pipeline, each rank once
            lanes = [
                tuple(dict.fromkeys(g[i * len(g) // most] for g in groups)) for i in range(most)
            ]
            chains += lanes
            p2p = tuple(sorted(r for g in groups for r in g)) if pipe.has_tp else ()
            for r in dict.fromkeys(r for g in groups for r in g):
                own = owned[r]
                tp_ranks = groups[own[0]]
                j = tp_ranks.index(r)
                roles[r] = Role(
                    rank=r,
                    device=devices[r],
                    pipeline=p,
                    stages=tuple(own),
                    num_stages=len(pipe.stages),
                    layers=tuple(pipe.stages[s].layers for s in own),
                    tp_ranks=tp_ranks,
                    chain=lanes[j * most // len(tp_ranks)],
                    links=links(groups, own[0], j) if p2p else (),
                    p2p=p2p,
                )
        pipelines = tuple(tuple(rank[d] for d in pipe.devices) for pipe in plan.pipelines)
        buckets = tuple((b.blocks, tuple(rank[d] for d in b.owners)) for b in grad_buckets(plan))
        tied = ()
        if plan.model.tie_embeddings:
            ends = [
                st.devices for pipe in plan.pipelines for st in (pipe.stages[0], pipe.stages[-1])
            ]
            tied = tuple(sorted({rank[d] for group in ends for d in group}))
        tp_groups = tuple(
            tuple(rank[d] for d in st.devices)
            for pipe in plan.pipelines
            for st in pipe.stages
            if st.tp > 1
        )
        return cls(
            devices=devices,
            roles=tuple(roles),
            pipelines=pipelines,
            buckets=buckets,
            tied=tied,
            tp_groups=tp_groups,
            chains=tuple(chains),
        )

    def piece_groups(self, owners: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """A bucket over `owners` (lead ranks) whose TP degrees may differ: its sharded
        gradients cut into K pieces (K the largest degree; degrees are powers of two), piece i
        held by TP rank i // (K / k) of each owner group of degree k. Returns the ranks holding
        each piece, one per pipeline: each piece is all-reduced over them (one group when no
        owner has TP)."""
        groups = [self.roles[o].tp_ranks for o in owners]
        most = max(len(g) for g in groups)
        return tuple(tuple(g[i // (most // len(g))] for g in groups) for i in range(most))

    def union(self, owners: tuple[int, ...]) -> tuple[int, ...]:
        """Every rank of the owners' TP groups (they all hold the replicated parameters)."""
        return tuple(sorted(r for o in owners for r in self.roles[o].tp_ranks))

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def role(self, rank: int) -> Role:
        if not 0 <= rank < self.world_size:
            raise SpecError(
                f"rank {rank} outside the plan's {self.world_size} ranks", field="pipelines"
            )
        return self.roles[rank]


def plan_rank(plan: Plan, rank: int, world_size: int) -> int | None:
    """The rank a started process plays in the plan's numbering, or None when it has nothing to
    do. Two ways to start a plan: `world_size` = the plan's devices (rank r plays the plan's r-th
    device by id, as `hetpp train` starts them), or = the cluster's devices (rank r is cluster
    device r, as `torchrun --nproc-per-node` per node in cluster-file order starts them; a
    device the plan leaves unused gets None)."""
    devices = sorted({d for p in plan.pipelines for s in p.stages for d in s.devices})
    if world_size == len(devices):
        return rank
    if plan.cluster is not None and world_size == plan.cluster.num_devices:
        return devices.index(rank) if rank in devices else None
    cluster = f" or the cluster's {plan.cluster.num_devices}" if plan.cluster else ""
    raise SpecError(
        f"the plan uses {len(devices)} devices but {world_size} ranks were started "
        f"(start the plan's {len(devices)}{cluster})",
        field="pipelines",
    )


def _ordered_group(members: tuple[int, ...], timeout: timedelta) -> dist.ProcessGroup:
    """A group whose group rank i is `members[i]`. A torch whose `new_group` has no `sort_ranks`
    (2.11 has none, 2.13 has it) numbers a group's ranks in ascending order: there, a chain whose
    ranks descend anywhere cannot be built, and every rank stops here alike (each builds the same
    chains in turn)."""
    if "sort_ranks" in inspect.signature(dist.new_group).parameters:
        return dist.new_group(list(members), timeout=timeout, sort_ranks=False)
    if list(members) != sorted(members):
        raise SpecError(
            f"a pipeline over ranks {list(members)} (not in ascending order) needs a torch whose "
            f"new_group takes sort_ranks (2.13 does); this is torch {torch.__version__}",
            field="pipelines",
        )
    return dist.new_group(list(members), timeout=timeout)


class Groups:
    """Every process group the plan needs: pipelines (stage order) and reduction sets.

    Reduction sets (block owners, tied-weight holders) are keyed by their sorted ranks; a set of one
    rank needs no group and none is made."""

    def __init__(self, ranks: RankMap, rank: int, timeout_s: float):
        timeout = timedelta(seconds=timeout_s)
        role = ranks.role(rank)
        for members in ranks.chains:
            # Stage i must be group rank i: PipelineStage maps stage index to group rank.
            g = _ordered_group(members, timeout)
            if members == role.chain:
                self.pipeline = g
        self.tp: dist.ProcessGroup | None = None
        """This rank's TP group (None without TP)."""
        for members in ranks.tp_groups:
            g = dist.new_group(list(members), timeout=timeout)
            if members == role.tp_ranks:
                self.tp = g
        self.p2p: dist.ProcessGroup | None = None
        """In a pipeline with TP stages, the group of all its ranks, which its P2P crosses (a
        batch of P2P ops is on one group; a sender's peers can be in several lanes)."""
        for members in dict.fromkeys(r.p2p for r in ranks.roles if r.p2p):
            g = dist.new_group(list(members), timeout=timeout)
            if members == role.p2p:
                self.p2p = g
        sets = []
        for _, owners in ranks.buckets:
            pieces = ranks.piece_groups(owners)
            sets += [tuple(sorted(p)) for p in pieces]
            if len(pieces) > 1:
                sets.append(ranks.union(owners))
        sets.append(ranks.tied)
        self._reduce: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for members in dict.fromkeys(s for s in sets if len(s) > 1):
            self._reduce[members] = dist.new_group(list(members), timeout=timeout)

    def reduce_group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        return self._reduce[tuple(sorted(ranks))]
