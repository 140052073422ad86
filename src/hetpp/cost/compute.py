"""Per-layer compute costs on one GPU type at one micro-batch size, as prefix-summed arrays.

Measured profiles take precedence over the estimator for their GPU type. Everything the planner
asks many times (stage time, stage memory) becomes two array lookups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetpp.cost.comm import tp_link_for_type
from hetpp.cost.tp import tp_allreduce_s, tp_saved_bytes
from hetpp.profile.estimator import Calibration, estimate_layer
from hetpp.profile.table import LAYER_KINDS, ProfileTable
from hetpp.specs.catalog import GpuType
from hetpp.specs.cluster import Cluster, Link
from hetpp.specs.errors import SpecError
from hetpp.specs.model import BLOCK_KINDS, LayerSpec, ModelSpec
from hetpp.specs.trainspec import TrainSpec


@dataclass(frozen=True)
class LayerCosts:
    """Costs of every layer of the model for one micro-batch on one GPU type."""

    gpu: GpuType
    mbs: int
    """Micro-batch size (samples)."""
    fwd_s: np.ndarray
    """Forward seconds per layer."""
    bwd_s: np.ndarray
    """Backward seconds per layer, including the recomputed forward of a block when recomputing."""
    recompute_fwd_s: np.ndarray
    """The part of `bwd_s` that is a recomputed forward (a block's forward when recomputing,
    else 0): a split backward runs it again (`cost.pipeline.backward_parts_s`)."""
    saved_bytes: np.ndarray
    """Bytes one in-flight micro-batch keeps per layer until its backward."""
    peak_extra_bytes: np.ndarray
    """Transient bytes while a layer runs backward (its full activations when recomputing)."""
    send_bytes: np.ndarray
    """Bytes of the activation each layer sends to the next (per micro-batch)."""
    weight_grad_input_bytes: np.ndarray
    """Bytes a split backward keeps per layer from a micro-batch's I to its W besides the saved
    activations (`LayerSpec.weight_grad_input_bytes_per_sample`)."""
    input_grad_freed_bytes: np.ndarray
    """Of `saved_bytes`, what a last stage's I frees
    (`LayerSpec.input_grad_frees_bytes_per_sample`)."""
    source: str
    """'measured' or 'estimated'."""
    tp: int = 1
    """Tensor-parallel degree: the costs are those of one rank of a group of `tp` devices."""
    _fwd_cum: np.ndarray = field(init=False, repr=False)
    _bwd_cum: np.ndarray = field(init=False, repr=False)
    _recompute_cum: np.ndarray = field(init=False, repr=False)
    _saved_cum: np.ndarray = field(init=False, repr=False)
    _weight_grad_input_cum: np.ndarray = field(init=False, repr=False)
    _input_grad_freed_cum: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name, arr in (
            ("_fwd_cum", self.fwd_s),
            ("_bwd_cum", self.bwd_s),
            ("_recompute_cum", self.recompute_fwd_s),
            ("_saved_cum", self.saved_bytes),
            ("_weight_grad_input_cum", self.weight_grad_input_bytes),
            ("_input_grad_freed_cum", self.input_grad_freed_bytes),
        ):
            object.__setattr__(self, name, np.concatenate([[0.0], np.cumsum(arr)]))

    def fwd(self, start: int, end: int) -> float:
        return float(self._fwd_cum[end] - self._fwd_cum[start])

    def bwd(self, start: int, end: int) -> float:
        return float(self._bwd_cum[end] - self._bwd_cum[start])

    def recomputed_fwd(self, start: int, end: int) -> float:
        """`recompute_fwd_s` of layers [start, end)."""
        return float(self._recompute_cum[end] - self._recompute_cum[start])

    def saved(self, start: int, end: int) -> float:
        return float(self._saved_cum[end] - self._saved_cum[start])

    def weight_grad_inputs(self, start: int, end: int) -> float:
        """`weight_grad_input_bytes` of layers [start, end)."""
        return float(self._weight_grad_input_cum[end] - self._weight_grad_input_cum[start])

    def input_grad_freed(self, start: int, end: int) -> float:
        """`input_grad_freed_bytes` of layers [start, end)."""
        return float(self._input_grad_freed_cum[end] - self._input_grad_freed_cum[start])

    @property
    def fwd_cum(self) -> np.ndarray:
        """Prefix sums of fwd_s (length L+1), for vectorized range sums."""
        return self._fwd_cum

    @property
    def bwd_cum(self) -> np.ndarray:
        return self._bwd_cum

    @property
    def saved_cum(self) -> np.ndarray:
        return self._saved_cum


class CostModel:
    """The one place that turns (model, training settings, cluster, profiles) into costs."""

    def __init__(
        self,
        model: ModelSpec,
        train: TrainSpec,
        cluster: Cluster,
        profiles: ProfileTable | None = None,
        calibration: Calibration | None = None,
    ):
        self.model = model
        self.train = train
        self.cluster = cluster
        self.profiles = (profiles or ProfileTable(())).for_model(model.name, model.seq_len)
        self.calibration = calibration
        self._cache: dict[tuple[str, int, bool], LayerCosts] = {}
        self.pipeline_memo: dict[tuple, tuple] = {}
        """`cost.step`'s stage costs per pipeline already costed with this model."""
        self._check_profiles()

    def _check_profiles(self) -> None:
        for gpu in self.profiles.gpus():
            rows = self.profiles.for_gpu(gpu).rows
            kinds = {r.layer for r in rows if r.seq_len == self.model.seq_len}
            missing = sorted(set(LAYER_KINDS) - kinds)
            if missing:
                raise SpecError(
                    f"profile for GPU {gpu!r} lacks layer kinds {missing} "
                    f"at seq_len {self.model.seq_len}",
                    field="profile",
                )

    def layer_costs(
        self,
        gpu: GpuType,
        mbs: int,
        recompute: bool | None = None,
        tp: int = 1,
        tp_link: Link | None = None,
    ) -> LayerCosts:
        """Memoized per (GPU type, micro-batch size, recomputation, TP degree and link);
        `recompute` None: the TrainSpec's (a stage's own flag overrides it,
        `StagePlan.recomputes`). `tp` > 1: one rank of a tensor-parallel group whose
        all-reduces cross `tp_link` (None: the fastest fabric of a node of this type,
        `cost.comm.tp_link`)."""
        recompute = self.train.recompute if recompute is None else recompute
        if tp > 1 and self.model.config.layer_unit == "half":
            raise ValueError("tensor-parallel stages run whole blocks (layer_unit block)")
        if tp > 1 and tp_link is None:
            tp_link = tp_link_for_type(self.cluster, gpu.name)
        key = (gpu.name.lower(), mbs, recompute, tp, tp_link if tp > 1 else None)
        if key not in self._cache:
            self._cache[key] = self._build(gpu, mbs, recompute, tp, tp_link)
        return self._cache[key]

    def _build(
        self, gpu: GpuType, mbs: int, recompute: bool, tp: int, tp_link: Link | None
    ) -> LayerCosts:
        layers = self.model.layers
        measured = gpu.name.lower() in self.profiles.gpus()
        table = self.profiles.for_gpu(gpu.name) if measured else None
        fwd, bwd, again_s, saved, full, kept = [], [], [], [], [], []
        # float32 parameters under autocast: an RMSNorm's output gradient is float32, which the
        # spec counts at the model's dtype (`LayerSpec.weight_grad_input_rms_norm_bytes_...`)
        fp32_params = self.train.precision != "fp32" and not self.train.half_params
        promoted = 4 / self.model.dtype_bytes - 1 if fp32_params else 0.0
        for layer in layers:
            split = tp if layer.kind in BLOCK_KINDS else 1  # `cost.tp`: blocks only
            f, b, act = self._measured_or_estimated(table, gpu, layer, mbs, split)
            grads = layer.weight_grad_input_bytes_per_sample * mbs
            if split > 1:
                comm = tp_allreduce_s(layer.send_bytes_per_sample * mbs, split, tp_link)
                f, b = f + comm, b + comm
                act = tp_saved_bytes(act, layer.saved_bytes_whole_under_tp_per_sample * mbs, split)
                whole = layer.weight_grad_input_whole_under_tp_per_sample * mbs
                grads = tp_saved_bytes(grads, whole, split)
            grads += layer.weight_grad_input_rms_norm_bytes_per_sample * mbs * promoted
            # The runtime recomputes transformer blocks only (runtime/recompute.py): the
            # embedding and the head keep their activations and run forward once.
            again = recompute and layer.kind in BLOCK_KINDS
            fwd.append(f)
            again_s.append(f if again else 0.0)
            bwd.append(b + again_s[-1])
            full.append(act if again else 0.0)
            kept.append(grads)
            saved.append(layer.saved_bytes_recompute_per_sample * mbs if again else act)
        return LayerCosts(
            gpu=gpu,
            mbs=mbs,
            fwd_s=np.array(fwd),
            bwd_s=np.array(bwd),
            recompute_fwd_s=np.array(again_s),
            saved_bytes=np.array(saved, dtype=float),
            peak_extra_bytes=np.array(full, dtype=float),
            send_bytes=np.array([x.send_bytes_per_sample * mbs for x in layers], dtype=float),
            weight_grad_input_bytes=np.array(kept, dtype=float),
            input_grad_freed_bytes=np.array(
                [x.input_grad_frees_bytes_per_sample * mbs for x in layers], dtype=float
            ),
            source="measured" if measured else "estimated",
            tp=tp,
        )

    def _measured_or_estimated(
        self, table: ProfileTable | None, gpu: GpuType, layer: LayerSpec, mbs: int, split: int
    ) -> tuple[float, float, float]:
        """(forward s, backward s, saved bytes) of `layer` at `mbs` samples, its compute split
        over `split` TP ranks: the profile's row where the GPU type is measured, else the
        estimator. A half block (`layer_unit` half) takes its share of the whole block's: of
        its FLOPs for time, of its activations for bytes (profiles and the estimator's fit are
        per block)."""
        whole = self.model.block_layer if layer.kind in ("attention", "mlp") else layer
        if table is not None:
            f, b, _ = table.lookup(gpu.name, whole.kind, mbs / split)
            act = table.lookup(gpu.name, whole.kind, mbs)[2]
        else:
            f, b = estimate_layer(whole, self.model, mbs / split, gpu, self.calibration)
            act = whole.saved_bytes_per_sample * mbs
        if whole is layer:
            return f, b, act
        time_share = layer.fwd_flops_per_token / whole.fwd_flops_per_token
        byte_share = layer.saved_bytes_per_sample / whole.saved_bytes_per_sample
        return f * time_share, b * time_share, act * byte_share
