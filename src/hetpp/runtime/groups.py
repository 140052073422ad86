"""Who runs what: rank <-> plan device, each rank's (pipeline, stage), and the process groups.

Ranks are the plan's device ids in increasing order, so a plan over devices 0..N-1 runs rank r on
device r. `dist.new_group` is collective over the whole world, so every rank creates every group, in
one order computed from the plan alone.
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
    stage: int
    """Stage index inside that pipeline."""
    num_stages: int
    """Stages in that pipeline."""
    layers: tuple[int, int]
    """Layer range [start, end) of the stage."""


def plan_devices(plan: Plan) -> list[int]:
    """Devices the plan uses, in rank order."""
    return sorted(s.device for p in plan.pipelines for s in p.stages)


def role_of(plan: Plan, rank: int) -> Role:
    devices = plan_devices(plan)
    if not 0 <= rank < len(devices):
        raise SpecError(f"rank {rank} outside the plan's {len(devices)} ranks", field="pipelines")
    device = devices[rank]
    for p, pipe in enumerate(plan.pipelines):
        for s, st in enumerate(pipe.stages):
            if st.device == device:
                return Role(
                    rank=rank,
                    device=device,
                    pipeline=p,
                    stage=s,
                    num_stages=len(pipe.stages),
                    layers=st.layers,
                )
    raise AssertionError("unreachable: every plan device has a stage")


def pipeline_ranks(plan: Plan) -> list[tuple[int, ...]]:
    """Each pipeline's ranks in stage order."""
    rank = {d: r for r, d in enumerate(plan_devices(plan))}
    return [tuple(rank[d] for d in pipe.devices) for pipe in plan.pipelines]


def bucket_ranks(plan: Plan) -> list[tuple[tuple[tuple[int, int], ...], tuple[int, ...]]]:
    """(layer ranges, owner ranks in pipeline order) of every gradient bucket, in the order all
    ranks issue their all-reduces (`grad_buckets`: latest layers first, as the simulator has it)."""
    rank = {d: r for r, d in enumerate(plan_devices(plan))}
    return [(b.blocks, tuple(rank[d] for d in b.owners)) for b in grad_buckets(plan)]


def tied_ranks(plan: Plan) -> tuple[int, ...]:
    """Ranks holding the embedding or the head of a tied model (each holds the tied weight)."""
    if not plan.model.tie_embeddings:
        return ()
    return tuple(sorted({r for ranks in pipeline_ranks(plan) for r in (ranks[0], ranks[-1])}))


class Groups:
    """Every process group the plan needs: pipelines (stage order) and reduction sets.

    Reduction sets (block owners, tied-weight holders) are keyed by their sorted ranks; a set of one
    rank needs no group and none is made."""

    def __init__(self, plan: Plan, rank: int, timeout_s: float):
        timeout = timedelta(seconds=timeout_s)
        mine = role_of(plan, rank).pipeline
        for p, ranks in enumerate(pipeline_ranks(plan)):
            # Stage i must be group rank i: PipelineStage maps stage index to group rank.
            g = dist.new_group(list(ranks), timeout=timeout, sort_ranks=False)
            if p == mine:
                self.pipeline = g
        sets = [tuple(sorted(owners)) for _, owners in bucket_ranks(plan)]
        sets.append(tied_ranks(plan))
        self._reduce: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for ranks in dict.fromkeys(s for s in sets if len(s) > 1):
            self._reduce[ranks] = dist.new_group(list(ranks), timeout=timeout)

    def reduce_group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        return self._reduce[tuple(sorted(ranks))]
