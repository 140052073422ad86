"""What a rank really keeps: model states, activations held for backward, and the receive
buffers of torch's pipeline stage (`--memory-report`).

On CPU there is no allocator to ask, so what is held is counted as it is held:
- `torch.autograd.graph.saved_tensors_hooks` sees every tensor a forward saves for its backward; a
  handle per saved tensor counts its storage (each storage once, parameters excluded: they are
  model states) until autograd drops it after that backward. A recomputed block saves nothing but
  its input, which `track` counts while the checkpoint keeps it; the stage's output, which
  `PipelineStage` keeps (`fwd_cache`) until the micro-batch's backward, is held the same way.
- Half-precision weight copies: autocast casts each weight once per step and caches the copy
  until the step's autocast region exits; a dispatch mode sees each cast of a parameter and
  counts the copy while it lives (a copy that is also saved for backward counts once, here).
- Between a split backward's input-grad (I) and weight-grad (W) actions: the forward's saved
  tensors stay packed (torch's I runs with `retain_graph=True`), so the hooks keep counting them
  until W frees the graph; what torch's `stage_backward_input` adds, the gradient flowing into
  each op that reads a weight (`backward_state`'s parameter groups, `"grads"`), is no saved
  tensor, so `track` counts each of those after the I until the W drops it (`_hold_pending`).
- Receive buffers: `PipelineStage` allocates one activation buffer (non-first stage) and one
  gradient buffer (non-last stage) per micro-batch of the step; hetpp's stage gives each memory
  only while it is live (`hetpp.runtime.recv_buffers`) and counts the live bytes; their peak is
  the figure, apart from the activations (a buffer also saved by the first layer counts once, as
  a buffer).
A rank running several stages (interleaved and V schedules) is one measurement: one meter sees
every stage's saved tensors (their peak together), the states count each storage once (a tied
embedding and head on one rank are one tensor), and the buffers are each stage's peak summed, as
the cost model charges a device (`cost.memory.device_memory`).
On CUDA, `torch.cuda.max_memory_allocated` is the figure (everything the caching allocator handed
out, workspaces and transients included); the buffers are still read from the stage.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hetpp.runtime.recv_buffers import LiveBuffers
from hetpp.runtime.stage import TimedStage
from hetpp.runtime.tp import local_tensor


class SavedTensorMeter:
    """Live and peak bytes of the storages held for backward."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude
        """Storage pointers not to count (the parameters')."""
        self.buffers: Sequence[LiveBuffers] = ()
        """The rank's stages' receive buffers, counted as buffers: their live storages are not
        counted here (`MemoryProbe.watch`)."""
        self.live: dict[int, list[int]] = {}
        """Storage pointer -> [handles alive, bytes]."""
        self.now = 0
        self.peak = 0
        self.copies_now = 0
        """Bytes of the live half-precision weight copies (also in `now`)."""
        self.copies_peak = 0

    def region(self) -> contextlib.AbstractContextManager:
        """Count what autograd saves, and the weight copies autocast makes, inside this region."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack))
        stack.enter_context(_WeightCopies(self))
        return stack

    def track(self, tensor: torch.Tensor, copy: bool = False) -> None:
        """Count `tensor`'s storage for as long as the tensor lives (a recomputed block's input,
        which the checkpoint keeps until the block's backward; a stage's output, which torch's
        stage keeps until the micro-batch's backward; with `copy`, a weight copy)."""
        storage = _storage(tensor)
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if self.excluded(key) or nbytes == 0:
            return
        self._add(key, nbytes)
        if copy:
            self.copies_now += nbytes
            self.copies_peak = max(self.copies_peak, self.copies_now)
        weakref.finalize(tensor, self._freed, key, nbytes, copy).atexit = False

    def excluded(self, key: int) -> bool:
        """Whether the storage at `key` is a parameter's or a live receive buffer's."""
        return key in self.exclude or any(key in b.storages() for b in self.buffers)

    def _freed(self, key: int, nbytes: int, copy: bool) -> None:
        if copy:
            self.copies_now -= nbytes
        self._drop(key)

    def _pack(self, t: torch.Tensor) -> tuple[Any, torch.Tensor]:
        # Detached: a saved output holding itself (and so its grad_fn) would be a reference
        # cycle that keeps the graph's buffers alive until the garbage collector runs.
        return _Handle(self, t), t.detach()

    def _add(self, key: int, nbytes: int) -> None:
        entry = self.live.setdefault(key, [0, nbytes])
        if entry[0] == 0:
            self.now += nbytes
            self.peak = max(self.peak, self.now)
        entry[0] += 1

    def _drop(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:  # forgotten while held
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.live[key]


def _storage(t: torch.Tensor) -> torch.UntypedStorage:
    """The storage `t`'s bytes live in (a DTensor's: its local shard's, what the rank holds)."""
    return local_tensor(t).untyped_storage()


def _unpack(packed: tuple[Any, torch.Tensor]) -> torch.Tensor:
    return packed[1]


class _Handle:
    """Counts one saved tensor's storage while autograd keeps this object."""

    def __init__(self, meter: SavedTensorMeter, t: torch.Tensor):
        storage = _storage(t)
        self.meter, self.key = meter, storage.data_ptr()
        if meter.excluded(self.key) or storage.nbytes() == 0:
            self.meter = None
            return
        meter._add(self.key, storage.nbytes())

    def __del__(self) -> None:
        if self.meter is not None:
            self.meter._drop(self.key)


class _WeightCopies(TorchDispatchMode):
    """Sees autocast's casts of parameters (below autocast, each cast is an `aten._to_copy` of
    the parameter; a cached weight is cast once per region) and has the meter count each copy."""

    def __init__(self, meter: SavedTensorMeter):
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.nn.Parameter):
            self.meter.track(out, copy=True)
        return out


def state_bytes(module: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Bytes of parameters (each storage once: a shared tied weight counts once), their gradients,
    what the optimizer steps (the parameters' own storage, or fp32 masters of half-precision
    ones) and the optimizer's tensor states."""
    seen: dict[int, int] = {}
    tensors = [p for p in module.parameters()] + [p.grad for p in module.parameters()]
    tensors += [p for g in opt.param_groups for p in g["params"]]
    tensors += [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    for t in tensors:
        if t is not None and t.ndim:
            s = _storage(t)
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def parameter_storages(module: torch.nn.Module) -> set[int]:
    return {_storage(p).data_ptr() for p in module.parameters()}


def pending_weight_grad_inputs(pstage: TimedStage, mb_index: int) -> list[torch.Tensor]:
    """What torch's stage keeps for micro-batch `mb_index`'s W after its I besides the graph:
    the gradients `stage_backward_input` caught flowing into each op that reads a weight (its
    parameter groups' `"grads"`; none on a first stage, whose I torch skips)."""
    _, groups, _, _ = pstage.backward_state[mb_index]
    grads = (g for group in groups or () for caught in group.get("grads") or () for g in caught)
    return [g for g in grads if g is not None]


class MemoryProbe:
    """One rank's `--memory-report` measurement over a run."""

    def __init__(self, stages: Sequence[torch.nn.Module], device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        params = set().union(*(parameter_storages(st) for st in stages))
        self.meter = None if self.cuda else SavedTensorMeter(params)
        """Counts what is held for backward on CPU (None on CUDA: the allocator's peak is read)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
            return
        for stage in stages:
            stage.register_forward_hook(self._hold_output)

    def _hold_output(self, module: torch.nn.Module, args: Any, out: torch.Tensor) -> None:
        # PipelineStage keeps the output (fwd_cache, then backward_state) until this
        # micro-batch's backward on the stage is done.
        self.meter.track(out)

    def watch(self, pstages: Sequence[TimedStage]) -> None:
        """On CPU, count the stages' receive buffers as buffers from the first step on (a
        buffer a checkpoint saved in step 1 and the multi-stage runtime keeps alive into step 2
        would otherwise count its bytes after `LiveBuffers.release` has freed them), and what
        each stage's split backward keeps from an I to its W."""
        if self.meter is None:
            return
        self.meter.buffers = [pstage.recv_buffers for pstage in pstages]
        for pstage in pstages:
            pstage.after_input_grad = lambda mb, st=pstage: self._hold_pending(st, mb)

    def _hold_pending(self, pstage: TimedStage, mb_index: int) -> None:
        for grad in pending_weight_grad_inputs(pstage, mb_index):
            self.meter.track(grad)

    def reset(self, pstages: Sequence[TimedStage]) -> None:
        """Forget the peak so far (the first step's one-off set-up)."""
        for pstage in pstages:
            pstage.recv_buffers.reset_peak()
        if self.meter is not None:
            self.meter.peak = self.meter.now
            self.meter.copies_peak = self.meter.copies_now
        else:
            torch.cuda.reset_peak_memory_stats(self.device)

    def region(self) -> contextlib.AbstractContextManager:
        """Around each step's schedule (forward and backward of every micro-batch)."""
        return self.meter.region() if self.meter is not None else contextlib.nullcontext()

    def record(self, rank: int, device_id: int, pstages: Sequence[TimedStage],
               module: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:  # fmt: skip
        """The rank's `{"kind": "memory", ...}` record (measured fields) over its stages
        `pstages`, whose modules `module` holds."""
        states = state_bytes(module, opt)
        buffers = sum(pstage.recv_buffers.peak_bytes for pstage in pstages)
        copies = 0
        if self.cuda:
            total = torch.cuda.max_memory_allocated(self.device)
            method, acts = "cuda max_memory_allocated", total - states - buffers
        else:
            # The copies' peak is part of the saved peak (one storage, counted once).
            method, copies = "saved_tensors_hooks", self.meter.copies_peak
            acts = self.meter.peak - copies
            total = states + copies + acts + buffers
        return {
            "kind": "memory",
            "rank": rank,
            "device": device_id,
            "method": method,
            "measured_bytes": total,
            "measured_states_bytes": states + copies,
            "measured_activation_bytes": acts,
            "measured_recv_buffer_bytes": buffers,
        }
