"""Training settings that change cost and memory."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt, model_validator

from hetpp.specs.limits import MAX_GLOBAL_BATCH

Schedule = Literal["1f1b", "gpipe"]
Precision = Literal["bf16", "fp16", "fp32"]

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
    """Bytes of each gradient element (2 for bf16 grads, 4 for fp32; fp32 training defaults
    to 4)."""
    optimizer_bytes_per_param: NonNegativeFloat = 12.0
    """Optimizer state per parameter: fp32 master + Adam m and v = 12 bytes (16 with weights
    and grads in bf16, the usual mixed-precision Adam figure); fp32 training has no master copy
    and defaults to 8."""
    recompute: bool = False
    """Full activation recomputation: keep only each layer's input, redo forward in backward."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule: 1F1B (bounded in-flight micro-batches) or GPipe (all in flight)."""
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

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.precision]

    @property
    def state_bytes_per_param(self) -> float:
        """Weights + grads + optimizer state, bytes per parameter."""
        return self.dtype_bytes + self.grad_bytes_per_param + self.optimizer_bytes_per_param

    @property
    def reserve_bytes(self) -> int:
        return int(self.reserve_gb * 1e9)
