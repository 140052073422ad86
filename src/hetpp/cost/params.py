"""Which parameters a stage stores and which gradients it sums: the tied-weight rule.

A model whose head reuses the embedding matrix (`stored_params > params` on the last layer)
keeps a copy of that matrix wherever the head lives. The copy is stored and stepped like any
weight, but its gradient is summed through its own bucket (the block buckets carry `params`),
and a stage holding both ends of the model keeps one tensor for both.

Tensor parallelism over k devices splits each transformer block's parameters k ways (column and
row shards), but for its norm weights and row-parallel biases, which every rank keeps whole
(`LayerSpec.params_whole_under_tp`). The embedding and the head stay whole on every rank of
the group, so `tp` divides the block parameters only."""

from __future__ import annotations

from functools import cached_property, lru_cache

import numpy as np

from hetpp.specs.model import BLOCK_KINDS, LayerSpec, ModelSpec


def _tp_split(layer: LayerSpec) -> int:
    """Parameters of `layer` that TP splits over its ranks (a block's but the whole ones)."""
    return layer.params - layer.params_whole_under_tp if layer.kind in BLOCK_KINDS else 0


def tied_copy_params(model: ModelSpec) -> int:
    """Parameters of the head's copy of the embedding matrix (0 when untied)."""
    last = model.layers[-1]
    return last.stored_params - last.params


@lru_cache(maxsize=256)
def rank_stored_params(model: ModelSpec, tp: int) -> np.ndarray:
    """Per layer, the parameters one rank of a TP group of `tp` devices stores (a block's split
    ones 1/tp, its whole ones all; the embedding and the head all). Memoized (read-only
    array): the full cost asks for it once per stage."""
    out = np.array([x.stored_params - _tp_split(x) * (1 - 1 / tp) for x in model.layers])
    out.flags.writeable = False
    return out


@lru_cache(maxsize=65536)
def stage_params(model: ModelSpec, start: int, end: int, tp: int = 1) -> float:
    """Parameters stored by one device of a stage holding layers [start, end) over `tp`
    tensor-parallel devices. Memoized: the full cost of a large plan asks for the same few
    ranges for thousands of stages."""
    total = float(rank_stored_params(model, tp)[start:end].sum())
    if start == 0 and end == len(model.layers):
        total -= tied_copy_params(model)
    return total


def replicated_params(model: ModelSpec, start: int, end: int) -> int:
    """Parameters of a stage holding [start, end) that optimizer sharding leaves whole: the tied
    embedding/head matrix (the embedding's or the head's copy, one tensor if both), which has its
    own all-reduce and is stepped in full by every holder."""
    ends_model = start == 0 or end == len(model.layers)
    return tied_copy_params(model) if ends_model else 0


def stepped_params(num_params: float, replicated: float, shards: int) -> float:
    """Parameters whose optimizer state (and step) an owner keeps when each bucket is sharded
    `shards` ways: its 1/shards of the sharded ones, all of the `replicated` ones."""
    return (num_params - replicated) / shards + replicated


class ParamSums:
    """`stage_params` and the block-gradient parameters of any layer range, from prefix sums
    (for planners that try many ranges)."""

    def __init__(self, model: ModelSpec):
        self.model = model

    @cached_property
    def _stored_cum(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([x.stored_params for x in self.model.layers])])

    @cached_property
    def _own_cum(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([x.params for x in self.model.layers])])

    @cached_property
    def _split_cum(self) -> np.ndarray:
        """Prefix sums of the parameters TP splits (`_tp_split`)."""
        return np.concatenate([[0], np.cumsum([_tp_split(x) for x in self.model.layers])])

    def _split_off(self, a: int, b: int, tp: int) -> float:
        """Block parameters of [a, b) a TP rank does not hold (tp - 1 of every tp)."""
        return float(self._split_cum[b] - self._split_cum[a]) * (1 - 1 / tp)

    def stored(self, a: int, b: int, tp: int = 1) -> float:
        """Parameters one device of a stage holding [a, b) over `tp` devices stores (what its
        optimizer steps)."""
        if (a, b) == (0, len(self.model.layers)):
            return stage_params(self.model, a, b, tp)
        return float(self._stored_cum[b] - self._stored_cum[a]) - self._split_off(a, b, tp)

    def synced(self, a: int, b: int, tp: int = 1) -> float:
        """Parameters of [a, b) whose gradients one device's block all-reduce sums, when the
        least TP degree among the block's owners is `tp` (each rank syncs its shard)."""
        return float(self._own_cum[b] - self._own_cum[a]) - self._split_off(a, b, tp)
