"""Activation recomputation of a stage: each transformer block (or half of one, at `layer_unit`
half) under non-reentrant checkpoint.

The block keeps only its input for backward and runs its forward again there
(`torch.utils.checkpoint`, `use_reentrant=False`, which also replays the autocast state of the
forward). The embedding and the head run once, as the cost model charges them. The block's
`forward` is wrapped in place rather than the module replaced, so parameter names, checkpoints
and --verify see the same module tree with recomputation on or off.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from hetpp.runtime.memory import SavedTensorMeter
from hetpp.runtime.model import StageModule


def recompute_blocks(stage: StageModule, meter: SavedTensorMeter | None = None) -> list[int]:
    """Wrap every block or half of `stage` (not the embedding or the head); the wrapped layer
    indices.
    With a `meter`, each block's input counts as saved until the block's backward."""
    head = stage.config.head_index
    blocks = [i for i in range(stage.start, stage.end) if 0 < i < head]
    for i in blocks:
        layer = stage.layer(i)
        layer.forward = _checkpointed(layer.forward, meter)
    return blocks


def _checkpointed(
    forward: Callable[[torch.Tensor], torch.Tensor], meter: SavedTensorMeter | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        out = checkpoint(forward, x, use_reentrant=False)
        if meter is not None:
            meter.track(x)
        return out

    return run
