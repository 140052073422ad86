"""Measure the embedding, one block and the head (the runtime's own modules) on the local device.

Per (layer kind, micro-batch size): forward seconds, backward seconds (the head's include the loss)
and the bytes one forward keeps for backward. Times are medians after warm-up, taken with CUDA
events on a GPU and `perf_counter` on the CPU. Kept bytes are the unique storages autograd saves
(`saved_tensors_hooks`), parameters excluded: the same definition on every device.

`cold=True` evicts the caches before every timed call (by writing a buffer larger than them). That
is the condition a rank meets under CPU emulation: between two of its calls it sleeps while other
ranks run, and they evict its weights and activations (how much that matters, measured:
docs/benchmarks-runtime-choices.md).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from hetpp.profile.table import ProfileRow
from hetpp.runtime.model import build_layer, token_loss_sum
from hetpp.specs.model import ModelConfig

KINDS = ("embedding", "block", "head")
EVICT_BYTES = 256 << 20
"""Buffer written before each timed call of a cold profile: larger than any CPU's last-level
cache or GPU's L2 it will meet."""


class _Timer:
    """Seconds taken by `fn()`; CUDA events on a GPU (kernels run asynchronously)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], object]) -> tuple[float, object]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3, out
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out


def _saved_bytes(
    fn: Callable[[], torch.Tensor], params: list[torch.Tensor]
) -> tuple[int, torch.Tensor]:
    """Run `fn` and count the bytes of the distinct storages autograd keeps for backward."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def _layer_fns(
    c: ModelConfig, kind: str, mbs: int, seq_len: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.nn.Module, Callable[[], torch.Tensor]]:
    """The layer and a function running its forward on fresh inputs, returning what to backprop."""
    # Measured costs are per whole block (`ModelSpec.block_layer`), whatever unit cuts the list.
    c = c.model_copy(update={"layer_unit": "block"})
    index = {"embedding": 0, "block": 1, "head": c.head_index}[kind]
    layer = build_layer(c, index, seed=0, dtype=dtype).to(device)
    g = torch.Generator(device=device).manual_seed(index)
    tokens = torch.randint(0, c.vocab_size, (mbs, seq_len), device=device, generator=g)
    if kind == "embedding":
        return layer, lambda: layer(tokens)
    hidden = torch.randn(mbs, seq_len, c.hidden_size, device=device, dtype=dtype, generator=g)
    hidden.requires_grad_(True)
    if kind == "block":
        return layer, lambda: layer(hidden)
    return layer, lambda: token_loss_sum(layer(hidden), tokens) / tokens.numel()


def profile_layer(
    c: ModelConfig,
    kind: str,
    mbs: int,
    seq_len: int,
    device: torch.device,
    dtype: torch.dtype,
    warmup: int = 2,
    repeats: int = 5,
    cold: bool = False,
) -> tuple[float, float, int]:
    """(forward s, backward s, kept bytes) of one layer kind at one micro-batch size; `cold`:
    caches evicted before each timed call (see the module docstring)."""
    layer, forward = _layer_fns(c, kind, mbs, seq_len, device, dtype)
    timer = _Timer(device)
    params = list(layer.parameters())
    act_bytes, _ = _saved_bytes(forward, params)
    evict = torch.empty(EVICT_BYTES, dtype=torch.uint8, device=device) if cold else None
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        layer.zero_grad(set_to_none=True)
        _evict(evict)
        tf, out = timer(forward)
        grad = torch.ones_like(out) if out.ndim == 0 else torch.randn_like(out)
        _evict(evict)
        tb, _ = timer(lambda o=out, g=grad: o.backward(g))
        if i >= warmup:
            fwd.append(tf)
            bwd.append(tb)
    return statistics.median(fwd), statistics.median(bwd), act_bytes


def _evict(buffer: torch.Tensor | None) -> None:
    """Write the buffer (evicting the caches) and wait until that is done."""
    if buffer is not None:
        buffer.fill_(1)
        if buffer.device.type == "cuda":
            torch.cuda.synchronize(buffer.device)


def profile_model(
    c: ModelConfig,
    gpu: str,
    mbs_list: list[int],
    seq_len: int,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int = 5,
    on_row: Callable[[ProfileRow], None] | None = None,
    cold: bool = False,
) -> list[ProfileRow]:
    """Rows for every layer kind and micro-batch size, in the ProfileTable format."""
    rows = []
    for kind in KINDS:
        for mbs in mbs_list:
            f, b, a = profile_layer(
                c, kind, mbs, seq_len, device, dtype, repeats=repeats, cold=cold
            )
            rows.append(ProfileRow(gpu, c.name, seq_len, kind, mbs, f, b, a))
            if on_row is not None:
                on_row(rows[-1])
    return rows
