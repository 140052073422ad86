"""Activation recomputation of a stage: each transformer block under non-reentrant checkpoint.

The block keeps only its input for backward and runs its forward again there
(`torch.utils.checkpoint`, `use_reentrant=False`, which also replays the autocast state of the
forward). The embedding and the head run once, as the cost model charges them. The block's
`forward` is wrapped in place rather than the module replaced, so parameter names, checkpoints
and --verify see the same module tree with recomputation on or off.
"""

from __future__ import annotations

import functools

from torch.utils.checkpoint import checkpoint

from hetpp.runtime.model import StageModule


def recompute_blocks(stage: StageModule) -> list[int]:
    """Wrap every block of `stage` (not the embedding or the head); the wrapped layer indices."""
    head = stage.config.num_layers + 1
    blocks = [i for i in range(stage.start, stage.end) if 0 < i < head]
    for i in blocks:
        layer = stage.layer(i)
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)
    return blocks
