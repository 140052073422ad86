"""Receive buffers that hold memory only while they are live.

torch's `PipelineStage` (2.13) allocates, once, one buffer per micro-batch of the step for the
activation a non-first stage receives (`args_recv_info[i]`) and one for the gradient a non-last
stage receives (`grad_recv_info[i]`), and keeps every one for the run: 2·m buffers where a stage
uses a few at a time. `LiveBuffers` gives each of those storages its bytes only while it is live:

- the activation of micro-batch i: from the moment its irecv is built (`_get_recv_ops`, which
  every schedule calls where it posts the receive: the single-stage schedules just before the
  forward, `_PipelineScheduleRuntime` at the RECV_F action torch's lowering placed) until i's
  backward on this stage is complete: its full backward, or under a split backward its
  weight-grad action, whose autograd pass runs through the graph that saved the input;
- the gradient of micro-batch i: from its irecv until the backward that reads it has run (full,
  or input-grad I; on stage 0 of a split backward torch reruns a full backward with it at W, so
  there until W).
A forward without backward (`schedule.eval`) frees its input when it returns.

Freeing is `untyped_storage().resize_(0)`, restoring `resize_(nbytes)` just before the irecv
that overwrites it: the tensor objects stay (torch's infos, autograd's references), only the
bytes go. The input gradient sent upstream is the buffer's `.grad`, its own tensor, untouched.
Only buffers torch allocated are touched: a V schedule's local hand-over
(`set_local_fwd_input`, `set_local_bwd_input`) replaces `info.buffer` with the neighbouring
stage's tensor, which is left alone (the replaced buffer stays freed).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

_NBYTES = "_hetpp_recv_nbytes"
"""Attribute marking a buffer torch allocated: its full size in bytes."""


class LiveBuffers:
    """The live bytes of one stage's torch-allocated receive buffers, and their peak."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        """id(buffer) -> its storage's pointer, for every buffer holding its bytes now."""
        self.live_bytes = 0
        self.peak_bytes = 0
        """Most `live_bytes` since the last `reset_peak`."""

    def adopt(self, infos: Iterable[tuple[Any, ...]]) -> None:
        """Take over the buffers torch just allocated (one tuple of `_RecvInfo` per micro-batch)
        and free them until their first receive."""
        for buf in _buffers(infos):
            setattr(buf, _NBYTES, buf.untyped_storage().nbytes())
            buf.untyped_storage().resize_(0)

    def restore(self, infos: tuple[Any, ...]) -> None:
        """Give one micro-batch's buffers their bytes back (a receive is about to fill them)."""
        for buf in _owned(infos):
            if id(buf) not in self.live:
                nbytes = getattr(buf, _NBYTES)
                buf.untyped_storage().resize_(nbytes)
                self.live[id(buf)] = buf.untyped_storage().data_ptr()
                self.live_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def release(self, infos: tuple[Any, ...]) -> None:
        """Free the buffers of one micro-batch (their last reader is done)."""
        for buf in _owned(infos):
            if self.live.pop(id(buf), None) is not None:
                self.live_bytes -= getattr(buf, _NBYTES)
                buf.untyped_storage().resize_(0)

    def storages(self) -> set[int]:
        """Storage pointers of the live buffers (the memory probe counts them as buffers)."""
        return set(self.live.values())

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes


def _buffers(infos: Iterable[tuple[Any, ...]]) -> list[torch.Tensor]:
    return [
        i.buffer
        for chunk in infos
        for i in chunk
        if not i.is_root_arg and isinstance(i.buffer, torch.Tensor)
    ]


def _owned(infos: tuple[Any, ...]) -> list[torch.Tensor]:
    return [b for b in _buffers([infos]) if hasattr(b, _NBYTES)]
