"""The pipeline stage hetpp runs: it times compute, stretches it in emulation, and tells the
gradient sync when the stage's last backward of the step begins and ends.

How: `PipelineStage.forward_one_chunk` / `backward_one_chunk` (and, under a zero-bubble schedule,
`backward_weight_one_chunk`, the weight-grad half of a split backward) are the calls in which a
schedule runs this stage's compute for one micro-batch (receives and sends happen around them).
The schedule passes `last_backward=True` to the stage's last full backward or last weight-grad
action: after it the stage's gradients are final. The subclass
times each call and, when emulating, then sleeps until `compute * factor` has passed since the call
began, so the micro-batch takes `factor x` its compute time, as it would on a device `factor x`
slower. `compute` is the calling thread's CPU time (one intra-op thread per rank, as the launcher
sets on a shared CPU), so time the rank spends descheduled while other processes run is not part
of the emulated device's time (sleeping `compute * (factor - 1)` after the call, as first built,
added it on top; measured: docs/benchmarks-runtime-choices.md).
Sleeping (not spinning) leaves the CPU to the other ranks of the box. It is a test and demo
harness, not a model of a GPU. On CUDA without emulation, each call is timed with CUDA events on
the compute stream instead, read once per step: no `synchronize` after every call, which would
also wait for the P2P streams and stop communication from overlapping compute.

The stage also gives torch's receive buffers memory only while they are live
(`hetpp.runtime.recv_buffers`): torch allocates one per micro-batch and direction and keeps them
all; here each holds its bytes from its receive until its last reader is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage
from torch.utils.checkpoint import GraphExecGroup

from hetpp.runtime.recv_buffers import LiveBuffers


class TimedStage(PipelineStage):
    """A PipelineStage that accumulates its compute seconds (`take_compute_s`)."""

    def __init__(
        self,
        *args: Any,
        slowdown: float = 1.0,
        before_last_backward: Callable[[], None] | None = None,
        after_last_backward: Callable[[], None] | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.slowdown = slowdown
        """Emulated slowdown factor (1: run at the speed of this machine)."""
        self.before_last_backward = before_last_backward
        """Called when the schedule starts the stage's last backward or weight-grad action of the
        step (gradients accumulated from now on are final)."""
        self.after_last_backward = after_last_backward
        """Called when that action has returned (every gradient of the stage is final)."""
        self.compute_s = 0.0
        """Seconds of (stretched) forward and backward compute since the last reset (CPU)."""
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        """CUDA: (start, end) events of each timed call since the last reset."""
        self.recv_buffers = LiveBuffers()
        """torch's receive buffers of this stage, holding memory only while live."""
        self.after_input_grad: Callable[[int], None] | None = None
        """Called with the micro-batch after a split backward's input-grad action (I) has
        returned (`--memory-report` counts what torch keeps from it for the W)."""

    def _timed(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.device.type == "cuda" and self.slowdown == 1.0:
            return self._timed_cuda(fn, *args, **kwargs)
        t0, cpu0 = time.perf_counter(), time.thread_time()
        out = fn(*args, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(
                self.device
            )  # emulating on a GPU: the stretch needs the time now
        if self.slowdown > 1.0:
            # The call ends `factor x` its CPU time after it began: CPU time, not wall time, so
            # that time spent descheduled (other ranks or other work on a shared CPU) is neither
            # multiplied by the factor nor added on top of the emulated duration.
            target = (time.thread_time() - cpu0) * self.slowdown
            time.sleep(max(0.0, target - (time.perf_counter() - t0)))
        self.compute_s += time.perf_counter() - t0
        return out

    def _timed_cuda(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Time the call with CUDA events on the compute stream: no synchronize, so the P2P
        streams and the gradient all-reduces keep overlapping compute (read in `take_compute_s`)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn(*args, **kwargs)
        end.record()
        self.events.append((start, end))
        return out

    def take_compute_s(self) -> float:
        """Compute seconds since the last call, and reset (on CUDA, waits for the timed kernels:
        called once per step, after the schedule)."""
        total = self.compute_s
        for start, end in self.events:
            end.synchronize()
            total += start.elapsed_time(end) / 1e3
        self.compute_s, self.events = 0.0, []
        return total

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        out = self._timed(super().forward_one_chunk, fwd_chunk_id, *args, **kwargs)
        if not (self.has_backward and torch.is_grad_enabled()):  # no backward reads the input
            self.recv_buffers.release(self.args_recv_info.get(fwd_chunk_id, ()))
        return out

    def backward_one_chunk(
        self,
        bwd_chunk_id: int,
        loss: Any = None,
        full_backward: bool = True,
        last_backward: bool = False,
    ) -> Any:
        out = self._last_backward(
            super().backward_one_chunk,
            bwd_chunk_id,
            loss=loss,
            full_backward=full_backward,
            last_backward=last_backward,
        )
        if self.has_backward and full_backward:  # else the weight-grad action still reads them
            self._release(bwd_chunk_id)
        elif self.has_backward and self.after_input_grad is not None:
            self.after_input_grad(bwd_chunk_id)
        return out

    def backward_weight_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        # torch's W runs one `autograd.grad` per parameter group, and a checkpointed block
        # recomputes its forward once per such call (6-7 times a block); in one group it
        # recomputes once per W (tests/unit/test_recompute_split_backward.py). The calls cover
        # disjoint parts of the graph, as the group requires.
        with GraphExecGroup():
            out = self._last_backward(
                super().backward_weight_one_chunk, bwd_chunk_id, *args, **kwargs
            )
        if self.has_backward:
            self._release(bwd_chunk_id)
        return out

    def _release(self, mb_index: int) -> None:
        """Free micro-batch `mb_index`'s receive buffers: its backward on this stage is done."""
        self.recv_buffers.release(self.args_recv_info.get(mb_index, ()))
        self.recv_buffers.release(self.grad_recv_info.get(mb_index, ()))

    # The receive buffers: torch allocates them in the two `_prepare_*_infra` calls of the first
    # step and fills them through `_get_recv_ops` (forward and backward, every schedule).
    def _prepare_forward_infra(self, *args: Any, **kwargs: Any) -> Any:
        out = super()._prepare_forward_infra(*args, **kwargs)
        self.recv_buffers.adopt(self.args_recv_info.values())
        return out

    def _prepare_backward_infra(self, *args: Any, **kwargs: Any) -> Any:
        out = super()._prepare_backward_infra(*args, **kwargs)
        self.recv_buffers.adopt(self.grad_recv_info.values())
        return out

    def _get_recv_ops(self, recv_infos: Any) -> list[torch.distributed.P2POp]:
        self.recv_buffers.restore(recv_infos)
        return super()._get_recv_ops(recv_infos)

    # torch 2.13's multi-stage runtime hands an input gradient from a stage to the previous one on
    # the same rank (a V's bottom) even in `schedule.eval`, where both stages have backward off
    # and refuse it: with backward off there is no gradient to hand over.
    def get_local_bwd_output(self, mb_index: int) -> Any:
        return super().get_local_bwd_output(mb_index) if self.has_backward else ()

    def set_local_bwd_input(self, outputs: Any, mb_index: int) -> None:
        if self.has_backward:
            # torch zeroes its own buffer where the handed-over gradient is None
            infos = self.grad_recv_info[mb_index]
            self.recv_buffers.restore(tuple(i for i, t in zip(infos, outputs) if t is None))
            super().set_local_bwd_input(outputs, mb_index)

    def _last_backward(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a backward action timed, between the last-backward callbacks when it is the
        stage's last (torch's schedules say so with `last_backward`; an input-grad action never
        is, its weight-grad action comes after it). `schedule.eval` runs the same schedule with
        backward off (the call returns at once): no gradient becomes final there."""
        last = bool(kwargs.get("last_backward")) and self.has_backward
        if last and self.before_last_backward is not None:
            self.before_last_backward()
        out = self._timed(fn, *args, **kwargs)
        if last and self.after_last_backward is not None:
            self.after_last_backward()
        return out
