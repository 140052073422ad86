"""P2P of a pipeline with TP stages, whose degree may change from stage to stage.

A pipeline with TP stages runs as lanes (`runtime/groups.py`): every rank runs torch's schedule
as its stage of its first lane, so all the ranks of a stage run the same actions in the same
order (their DTensor collectives match). What crosses a stage boundary is replicated over each
TP group: the activation after the row-parallel reduction, and the input gradient after the
column-parallel input's all-reduce in backward. So a receiver takes it from one rank of the
neighbouring stage, and a sender sends it to every rank that takes it from it (`groups.Link`):
with equal degrees TP rank j talks to TP rank j, as torchtitan's lanes; from a stage of degree k
to a wider one of degree k' each rank sends to k' / k ranks; to a narrower one, one rank in k / k'
sends and the others send nothing (their copy is the same).

`LaneStage` is `TimedStage` with its peers taken from those links; every message of the pipeline
(activations, gradients, and the shape metadata torch exchanges at the first step) travels over
one group of all the pipeline's ranks, since a batch of P2P ops must share a group and a narrow
rank's peers sit in several lanes. The schedule's classes run unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hetpp.runtime.groups import Link
from hetpp.runtime.stage import TimedStage


class LaneStage(TimedStage):
    """A TimedStage of a pipeline with TP stages: receives from each neighbour's `source`,
    sends to its `targets`, over `p2p_group`."""

    def __init__(
        self, *args: Any, links: tuple[Link, ...], p2p_group: dist.ProcessGroup, **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        self.links = {link.stage: link for link in links}
        """Neighbouring stage -> whom this rank receives from and sends to there."""
        self.p2p_group = p2p_group
        """Every rank of the pipeline (`Groups.p2p`)."""
        # On NCCL the first batched P2P call on a group must involve all its ranks; make this
        # collective, which every rank of the pipeline reaches building its stage, that call.
        dist.all_reduce(torch.zeros(1, device=self.device), group=p2p_group)

    # Every receive resolves its peer here (torch: `_get_recv_ops`, `_recv_meta`); the lane's
    # source is in this rank's lane group, so torch's ops build, and `_on_p2p` moves them.
    def _resolve_peer_global_rank(self, stage_idx: int) -> int:
        return self.links[stage_idx].source

    def _get_recv_ops(self, recv_infos: Any) -> list[dist.P2POp]:
        ops = super()._get_recv_ops(recv_infos)
        return [dist.P2POp(op.op, op.tensor, op.peer, self.p2p_group) for op in ops]

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._fan_out(super().get_fwd_send_ops(fwd_chunk_id), self.stage_index + 1)

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._fan_out(super().get_bwd_send_ops(bwd_chunk_id), self.stage_index - 1)

    def _fan_out(self, ops: list[dist.P2POp], stage: int) -> list[dist.P2POp]:
        """Torch's sends to `stage`, one per target there (none when another rank sends)."""
        return [
            dist.P2POp(op.op, op.tensor, t, self.p2p_group)
            for op in ops  # none at the pipeline's ends
            for t in self.links[stage].targets
        ]

    def _recv_meta(self, src_stage: int) -> Any:
        objects: list[Any] = [None]
        src = self.links[src_stage].source
        dist.recv_object_list(
            objects, src=src, group=self.p2p_group, device=self.device, use_batch=True
        )
        return objects[0]

    def _send_meta(self, meta: Any, dst_stage: int) -> None:
        for t in self.links[dst_stage].targets:
            dist.send_object_list(
                [meta], dst=t, group=self.p2p_group, device=self.device, use_batch=True
            )

    # torch's warm-up vote (static shapes given to every stage, or inferred at the first step)
    # sends to one peer per neighbour. hetpp gives no static shapes, so every stage votes
    # "inferred" and the outcome is known: 0, without the messages.
    def _warmup_forward_vote(self, has_backward: bool, received_acc: Any = None) -> torch.Tensor:
        return torch.zeros(1, dtype=torch.int32, device=self.device)

    def _warmup_backward_result(self, received_result: Any = None) -> torch.Tensor:
        return torch.zeros(1, dtype=torch.int32, device=self.device)
