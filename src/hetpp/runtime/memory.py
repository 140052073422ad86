"""What a rank really keeps: model states, and activations saved for backward (`--memory-report`).

On CPU there is no allocator to ask, so autograd's saved tensors are counted as it keeps them:
`torch.autograd.graph.saved_tensors_hooks` sees every tensor a forward saves for its backward; a
handle per saved tensor counts its storage (each storage once, parameters excluded: they are
model states) until autograd drops it after that backward. A recomputed block saves nothing but
its input, which `hold` counts until the block's backward. The peak over the run is what the
in-flight micro-batches kept at once. On CUDA, `torch.cuda.max_memory_allocated` is the figure
(everything the caching allocator handed out, workspaces and P2P buffers included).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


class SavedTensorMeter:
    """Live and peak bytes of the storages autograd holds for backward."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude
        """Storage pointers not to count (the parameters')."""
        self.live: dict[int, list[int]] = {}
        """Storage pointer -> [handles alive, bytes]."""
        self.now = 0
        self.peak = 0

    def region(self) -> contextlib.AbstractContextManager:
        """Count what autograd saves inside this region."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def hold(self, tensor: torch.Tensor, until: torch.Tensor) -> None:
        """Count `tensor` for as long as autograd keeps `until`'s graph node (a recomputed
        block's input, kept by the checkpoint until the block's backward)."""
        if until.grad_fn is not None:
            until.grad_fn.metadata["hetpp_held"] = _Handle(self, tensor)

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
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.live[key]


def _unpack(packed: tuple[Any, torch.Tensor]) -> torch.Tensor:
    return packed[1]


class _Handle:
    """Counts one saved tensor's storage while autograd keeps this object."""

    def __init__(self, meter: SavedTensorMeter, t: torch.Tensor):
        storage = t.untyped_storage()
        self.meter, self.key = meter, storage.data_ptr()
        if self.key in meter.exclude or storage.nbytes() == 0:
            self.meter = None
            return
        meter._add(self.key, storage.nbytes())

    def __del__(self) -> None:
        if self.meter is not None:
            self.meter._drop(self.key)


def state_bytes(module: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Bytes of parameters (each storage once: a shared tied weight counts once), their gradients
    and the optimizer's tensor states."""
    seen: dict[int, int] = {}
    tensors = [p for p in module.parameters()] + [p.grad for p in module.parameters()]
    tensors += [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    for t in tensors:
        if t is not None and t.ndim:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def parameter_storages(module: torch.nn.Module) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in module.parameters()}


class MemoryProbe:
    """One rank's `--memory-report` measurement over a run."""

    def __init__(self, stage: torch.nn.Module, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.meter = None if self.cuda else SavedTensorMeter(parameter_storages(stage))
        """Counts saved tensors on CPU (None on CUDA, where the allocator's peak is read)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    def reset(self) -> None:
        """Forget the peak so far (the first step's one-off set-up)."""
        if self.meter is not None:
            self.meter.peak = self.meter.now
        else:
            torch.cuda.reset_peak_memory_stats(self.device)

    def region(self) -> contextlib.AbstractContextManager:
        """Around each step's schedule (forward and backward of every micro-batch)."""
        return self.meter.region() if self.meter is not None else contextlib.nullcontext()

    def record(self, rank: int, device_id: int, stage: torch.nn.Module,
               opt: torch.optim.Optimizer) -> dict[str, Any]:  # fmt: skip
        """The rank's `{"kind": "memory", ...}` record (measured fields)."""
        states = state_bytes(stage, opt)
        if self.cuda:
            total = torch.cuda.max_memory_allocated(self.device)
            method, acts = "cuda max_memory_allocated", total - states
        else:
            method, acts = "saved_tensors_hooks", self.meter.peak
            total = states + acts
        return {
            "kind": "memory",
            "rank": rank,
            "device": device_id,
            "method": method,
            "measured_bytes": total,
            "measured_states_bytes": states,
            "measured_activation_bytes": acts,
        }
