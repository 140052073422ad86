"""Training settings that change cost and memory."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt, model_validator

from hetpp.specs.limits import MAX_GLOBAL_BATCH
from hetpp.specs.schedule import Schedule

Precision = Literal["bf16", "fp16", "fp32"]
MasterWeights = Literal["params", "optimizer"]

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}


class TrainSpec(BaseModel):
    """One training step's shape and the memory-relevant choices."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    global_batch: PositiveInt = Field(le=MAX_GLOBAL_BATCH)
    """Samples (sequences) per optimizer step, over all pipelines (at most
    `limits.MAX_GLOBAL_BATCH`)."""
    seq_len: PositiveInt = 2048
    """Tokens per sample."""
    precision: Precision = "bf16"
    """Weights/activations dtype; bf16/fp16 imply mixed precision with fp32 master weights."""
    grad_bytes_per_param: PositiveInt = 2
    """Bytes of each gradient element the block-wise all-reduces send (2: bf16, 4: fp32; fp32
    training defaults to 4). Stages keep fp32 gradients whatever this is
    (`kept_grad_bytes_per_param`)."""
    optimizer_bytes_per_param: NonNegativeFloat = 12.0
    """Optimizer state per parameter: fp32 master + Adam m and v = 12 bytes (16 with weights
    and grads in bf16, the usual mixed-precision Adam figure); fp32 training has no master copy
    and defaults to 8."""
    master_weights: MasterWeights = "params"
    """Where mixed precision (bf16/fp16) keeps the fp32 master weights. "params": the parameters
    themselves are fp32 (the masters), `torch.autocast` casts each weight to the half type for
    the step (2 B) and gradients accumulate in fp32 (4 B): 2 + 4 + 12 = 18 B per parameter.
    "optimizer" (Apex O2, Megatron's distributed optimizer): the parameters and their gradients
    are stored in the half type (2 + 2 B) and the optimizer holds an fp32 master copy beside
    AdamW's m and v (the 12 B of `optimizer_bytes_per_param`, which optimizer sharding splits
    over a bucket's owners: 2 + 2 + 12/P). The trade-off: micro-batch gradients are summed in
    the half type, so each accumulation and the cross-pipeline sum round to 8 (bf16) or 11
    (fp16) mantissa bits where "params" rounds to 24; the update itself is applied to the fp32
    masters, so small updates are not lost. Needs bf16/fp16 and 2-byte gradient reductions."""
    recompute: bool = False
    """Full activation recomputation: keep only each layer's input, redo forward in backward."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule, a name in `hetpp.specs.schedule.SCHEDULES`: 1F1B (bounded in-flight
    micro-batches) or GPipe (all in flight)."""
    reserve_gb: NonNegativeFloat = 2.0
    """Memory held back on every device for the CUDA context, allocator slack and workspaces."""

    @model_validator(mode="before")
    @classmethod
    def _fp32_defaults(cls, data: Any) -> Any:
        """fp32 training keeps fp32 gradients and no master copy: 4 + 4 + 8 = 16 bytes with
        the weights, unless the caller says otherwise."""
        if isinstance(data, dict) and data.get("precision") == "fp32":
            data = {"grad_bytes_per_param": 4, "optimizer_bytes_per_param": 8.0, **data}
        return data

    @model_validator(mode="after")
    def _half_params_need_half(self) -> TrainSpec:
        if self.master_weights == "optimizer":
            if self.precision == "fp32":
                raise ValueError(
                    "master_weights 'optimizer' stores half-precision parameters: it needs "
                    "precision bf16 or fp16"
                )
            if self.grad_bytes_per_param != 2:
                raise ValueError(
                    "master_weights 'optimizer' keeps half-precision gradients: "
                    "grad_bytes_per_param must be 2"
                )
        return self

    @property
    def half_params(self) -> bool:
        """Parameters and gradients stored in the half type, fp32 masters in the optimizer."""
        return self.master_weights == "optimizer"

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.precision]

    @property
    def kept_grad_bytes_per_param(self) -> int:
        """Bytes per gradient element a stage keeps: the parameters' dtype. With fp32 parameters
        (the masters) the runtime accumulates in fp32, so at least 4, whatever the reduction
        sends; with half-precision parameters (`master_weights` "optimizer") 2."""
        if self.half_params:
            return self.dtype_bytes
        return max(self.grad_bytes_per_param, 4)

    @property
    def state_bytes_per_param(self) -> float:
        """Weights + kept grads + optimizer state, bytes per parameter (18 in bf16 mixed
        precision: 2 + 4 + 12; 16 with half-precision parameters: 2 + 2 + 12; 16 in fp32:
        4 + 4 + 8)."""
        return self.dtype_bytes + self.kept_grad_bytes_per_param + self.optimizer_bytes_per_param

    @property
    def reserve_bytes(self) -> int:
        return int(self.reserve_gb * 1e9)
