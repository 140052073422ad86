"""How a rank executes the plan's `train.precision`: dtypes, autocast regions and fp16 loss scaling.

bf16 / fp16 are mixed precision: parameters stay float32 (they are the master weights the
optimizer updates), forward runs under `torch.autocast` in the half type, gradients and optimizer
states stay float32, and the gradient all-reduces send what `train.grad_bytes_per_param` says.
fp32 runs in float32 throughout; `--fp64` runs an fp32 plan in float64, for exactness tests only.

With `train.master_weights = "optimizer"` the parameters and their gradients are stored in the
half type (no autocast: the model runs in it), and the optimizer steps fp32 masters of them
(`optim.MasterWeights`); `--fp64` runs such a plan with float64 parameters and float64 masters,
the same code path with the roundings gone, for the exactness tests.

Autocast casts each weight to the half type once per step, not once per micro-batch: every
forward of the stage module opens its own `torch.autocast` region (`prepare`; so
backward, which the schedule runs outside them, is not autocast), while `step_region` keeps one
disabled autocast region open over the whole schedule step. Autocast clears its cast cache only
when its outermost region exits, so the half-precision weight copies are made by the first
micro-batch, shared by the others and dropped after the step: 2 bytes per parameter during the
step, the `weights` term the cost model charges for bf16 (docs/architecture.md, "Memory
accounting").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from hetpp.runtime.contract import check_executable
from hetpp.runtime.model import StageModule, token_loss_sum
from hetpp.specs.plan import Plan

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """The dtypes one run trains in."""

    name: str
    """The plan's `train.precision`, or "fp64" for an fp32 plan run with --fp64."""
    param_dtype: torch.dtype
    """Parameters and gradients; the optimizer states and, unless `master_dtype` is set, the
    master weights (autocast mixed precision)."""
    compute_dtype: torch.dtype | None
    """Autocast dtype of the forward; None when not mixed."""
    reduce_dtype: torch.dtype
    """Dtype of the block-wise and tied-weight all-reduces: the plan's `grad_bytes_per_param`
    says what each one sends (4: float32; 2: the half type, bf16 for fp32 plans)."""
    master_dtype: torch.dtype | None = None
    """Dtype of the master copies the optimizer steps (`optim.MasterWeights`), for plans with
    half-precision parameters; None: the optimizer steps the parameters themselves."""

    @classmethod
    def of(cls, plan: Plan, fp64: bool = False) -> Precision:
        """The dtypes of a plan that `contract.check_executable` accepted."""
        check_executable(plan, fp64)
        masters = plan.train.half_params
        if fp64:
            fp64_masters = torch.float64 if masters else None
            return cls("fp64", torch.float64, None, torch.float64, fp64_masters)
        name, half = plan.train.precision, HALF.get(plan.train.precision)
        if masters:
            return cls(name, half, None, half, torch.float32)
        reduce = torch.float32 if plan.train.grad_bytes_per_param == 4 else half or torch.bfloat16
        return cls(name, torch.float32, half, reduce)

    @property
    def loss_scaling(self) -> bool:
        """fp16's narrow exponent range needs dynamic loss scaling; bf16's does not."""
        return self.name == "fp16"

    def describe(self) -> str:
        """How this precision runs, for rank 0's start-up lines."""
        reduce = f"{_short(self.reduce_dtype)} gradient all-reduces"
        scaling = ", dynamic loss scaling (global inf/NaN check)" if self.loss_scaling else ""
        if self.master_dtype is not None:
            dtype = _short(self.param_dtype)
            return (
                f"{self.name}: weights, activations and gradients in {dtype}, "
                f"{_short(self.master_dtype)} master weights in the optimizer, {reduce}{scaling}"
            )
        if self.compute_dtype is None:
            dtype = _short(self.param_dtype)
            return f"{self.name}: weights, activations and gradients in {dtype}, {reduce}"
        return (
            f"{self.name}: torch.autocast({_short(self.compute_dtype)}) forward, float32 master "
            f"weights and gradients, {reduce}{scaling}"
        )

    def step_region(self, device: torch.device) -> contextlib.AbstractContextManager:
        """Around a whole step's schedule: keeps the autocast cast cache for the step."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, enabled=False)

    def forward_region(self, device: torch.device) -> contextlib.AbstractContextManager:
        """Around one micro-batch's forward."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.compute_dtype)

    def prepare(self, stage: StageModule, device: torch.device) -> None:
        """Make `stage` run in this precision (wrapped in place, as `recompute_blocks` does):
        every forward in `forward_region` (the schedule's micro-batches and its first-step shape
        inference alike), and the embedding's output in the half type, so the residual stream,
        its saved activations and the activations sent between stages are half precision, as the
        cost model charges them (autocast alone would keep them float32: the embedding's output
        is float32, and a half-precision branch added to it is too)."""
        if self.compute_dtype is None:
            return
        half = self.compute_dtype
        if stage.start == 0:
            embed = stage.layer(0)
            embed_forward = embed.forward
            embed.forward = lambda tokens: embed_forward(tokens).to(half)
        forward = stage.forward

        def run(*args: Any, **kwargs: Any) -> Any:
            with self.forward_region(device):
                return forward(*args, **kwargs)

        stage.forward = run


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def scaled_loss(
    logits: torch.Tensor, targets: torch.Tensor, tokens: int, scale: float
) -> torch.Tensor:
    """The micro-batch's share of the mean token loss over `tokens`, times the loss scale."""
    loss = token_loss_sum(logits, targets) / tokens
    return loss * scale if scale != 1.0 else loss


class LossScaler:
    """Dynamic loss scaling, as `torch.amp.GradScaler` does it, with the inf/NaN verdict supplied
    by the caller: GradScaler checks each rank's own gradients, but every rank of a pipelined run
    must skip the same steps, so the trainer all-reduces one flag and passes the global verdict."""

    def __init__(
        self,
        enabled: bool,
        init_scale: float = 2.0**16,
        growth_interval: int = 2000,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
    ):
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        """The factor the loss is multiplied by this step."""
        self.growth_interval = growth_interval
        self.growth, self.backoff = growth_factor, backoff_factor
        self._good_steps = 0

    def update(self, found_inf: bool) -> None:
        """After the step: back off on overflow, grow after `growth_interval` clean steps."""
        if not self.enabled:
            return
        if found_inf:
            self.scale *= self.backoff
            self._good_steps = 0
            return
        self._good_steps += 1
        if self._good_steps == self.growth_interval:
            self.scale *= self.growth
            self._good_steps = 0


def has_nonfinite(params: Iterable[torch.nn.Parameter], device: torch.device) -> torch.Tensor:
    """1.0 if any gradient entry is inf or NaN, else 0.0 (a tensor, to all-reduce)."""
    flag = torch.zeros((), dtype=torch.float32, device=device)
    for p in params:
        if p.grad is not None:
            flag = torch.maximum(flag, (~torch.isfinite(p.grad)).any().float())
    return flag
