"""Who runs what: rank <-> plan device, each rank's pipeline and stages, and the process groups.

Ranks are the plan's device ids in increasing order, so a plan over devices 0..N-1 runs rank r on
device r. `RankMap` works this out once from the plan; everything else asks it. `dist.new_group`
is collective over the whole world, so every rank creates every group, in one order computed from
the plan alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from hetpp.specs.errors import SpecError
from hetpp.specs.plan import Plan, grad_buckets


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

    @classmethod
    def of(cls, plan: Plan) -> RankMap:
        devices = tuple(sorted(d for p in plan.pipelines for d in p.devices))
        rank = {d: r for r, d in enumerate(devices)}
        owned: dict[int, list[int]] = {}
        for pipe in plan.pipelines:
            for s, st in enumerate(pipe.stages):
                owned.setdefault(rank[st.device], []).append(s)
        roles: list[Role | None] = [None] * len(devices)
        for p, pipe in enumerate(plan.pipelines):
            for d in pipe.devices:
                r = rank[d]
                roles[r] = Role(
                    rank=r,
                    device=d,
                    pipeline=p,
                    stages=tuple(owned[r]),
                    num_stages=len(pipe.stages),
                    layers=tuple(pipe.stages[s].layers for s in owned[r]),
                )
        pipelines = tuple(tuple(rank[d] for d in pipe.devices) for pipe in plan.pipelines)
        buckets = tuple((b.blocks, tuple(rank[d] for d in b.owners)) for b in grad_buckets(plan))
        tied = ()
        if plan.model.tie_embeddings:
            ends = [(pipe.stages[0].device, pipe.stages[-1].device) for pipe in plan.pipelines]
            tied = tuple(sorted({rank[d] for pair in ends for d in pair}))
        return cls(
            devices=devices, roles=tuple(roles), pipelines=pipelines, buckets=buckets, tied=tied
        )

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
    devices = sorted(d for p in plan.pipelines for d in p.devices)
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


class Groups:
    """Every process group the plan needs: pipelines (stage order) and reduction sets.

    Reduction sets (block owners, tied-weight holders) are keyed by their sorted ranks; a set of one
    rank needs no group and none is made."""

    def __init__(self, ranks: RankMap, rank: int, timeout_s: float):
        timeout = timedelta(seconds=timeout_s)
        mine = ranks.role(rank).pipeline
        for p, members in enumerate(ranks.pipelines):
            # Device i of the pipeline must be group rank i: PipelineStage maps a stage index to
            # a group rank by the schedule's placement (stage i: i, i mod D, or the V).
            g = dist.new_group(list(members), timeout=timeout, sort_ranks=False)
            if p == mine:
                self.pipeline = g
        sets = [tuple(sorted(owners)) for _, owners in ranks.buckets]
        sets.append(ranks.tied)
        self._reduce: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for members in dict.fromkeys(s for s in sets if len(s) > 1):
            self._reduce[members] = dist.new_group(list(members), timeout=timeout)

    def reduce_group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        return self._reduce[tuple(sorted(ranks))]
