"""Tensor parallelism inside a stage: what one rank of a group of k devices pays per block.

Megatron-style column/row parallel attention and MLP (no sequence parallelism):
- **Compute.** Each rank runs 1/k of every block's matmuls and 1/k of its heads, so a TP rank at
  micro-batch b does the FLOPs, and moves the split activations, of the whole block at b/k. The
  profile (or estimate) is asked at b/k: its own efficiency curve in micro-batch size then
  prices the smaller GEMMs (below the smallest measured size the time is held, launch-bound, so
  TP never looks better than the profile supports). The norms and residual adds, replicated on
  every rank, are not charged again: they are memory-bound elementwise work (a few percent of a
  block).
- **Communication.** Two all-reduces of the block's output-sized activation (b·s·h elements)
  per forward (after attention and after the MLP) and two per backward (the inputs' gradients),
  ring all-reduces over the k devices on the group's intra-node link (`cost.comm`). A
  recomputed forward pays its two again (it is a forward). Charged on the critical path: the
  collective waits on the matmul before it and the next matmul waits on it.
- **Memory.** Block parameters (and their gradients and optimizer state) are split k ways
  (`cost.params`); of the saved activations, the norms' inputs and outputs stay whole on every
  rank (`LayerSpec.saved_bytes_whole_under_tp_per_sample`) and the rest is split. With
  recomputation only the block input is kept, whole. The embedding and the head run whole on
  every rank of the group.
"""

from __future__ import annotations

from hetpp.cost.comm import allreduce_time_s
from hetpp.specs.cluster import Link

ALLREDUCES_PER_DIRECTION = 2
"""All-reduces per block forward (attention output, MLP output), and as many in backward."""


def tp_allreduce_s(activation_bytes: float, tp: int, link: Link) -> float:
    """Seconds one direction of one block spends in TP all-reduces of `activation_bytes`."""
    if tp == 1:
        return 0.0
    return ALLREDUCES_PER_DIRECTION * float(allreduce_time_s(activation_bytes, tp, link))


def tp_saved_bytes(saved_bytes: float, whole_bytes: float, tp: int) -> float:
    """Saved activations of one block on one TP rank: the whole part plus 1/tp of the rest."""
    return whole_bytes + (saved_bytes - whole_bytes) / tp
