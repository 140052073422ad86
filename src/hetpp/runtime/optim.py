"""Optimizer construction and global-norm clipping arithmetic, shared by the pipeline run and the
single-process reference so both do exactly the same maths."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

from hetpp.runtime.options import TrainOptions
from hetpp.runtime.tp import local_tensor


def make_optimizer(
    params: Iterable[torch.nn.Parameter],
    opts: TrainOptions,
    decays: Callable[[torch.nn.Parameter], bool] | None = None,
) -> torch.optim.Optimizer:
    """AdamW or SGD; weight decay on matrices only: norms and biases (1-d) are not decayed, as
    transformers' Trainer and torchtitan do. `decays` says it per parameter where the shape
    does not (a sharded piece of a matrix is 1-d: `runtime.shard`)."""
    params = list(params)
    decays = decays or (lambda p: p.ndim >= 2)
    groups = [
        {"params": [p for p in params if decays(p)], "weight_decay": opts.weight_decay},
        {"params": [p for p in params if not decays(p)], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if opts.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=opts.lr)
    return torch.optim.SGD(groups, lr=opts.lr)


class MasterWeights:
    """fp32 master copies of half-precision tensors, which the optimizer steps (Apex O2,
    Megatron's distributed optimizer; `TrainSpec.master_weights` "optimizer").

    The targets are what the rank updates: whole parameters, or with optimizer sharding its
    pieces of them (`runtime.shard`). Each step the targets' half-precision gradients are cast
    into the masters' `.grad` (exact: a half value is a float32 value), the optimizer steps the
    masters, and the targets take the updated masters, rounded to the half type. Loss
    unscaling and clipping act on the masters' gradients, in float32."""

    def __init__(self, targets: Iterable[torch.Tensor], dtype: torch.dtype):
        self.targets = list(targets)
        self.params = [
            torch.nn.Parameter(t.detach().to(dtype, copy=True), requires_grad=False)
            for t in self.targets
        ]
        self.master = dict(zip(self.targets, self.params))
        """Each target's master."""
        self.target = dict(zip(self.params, self.targets))
        """Each master's target."""
        self.dtype = dtype

    def take_grads(self) -> None:
        """The targets' gradients (summed over micro-batches and pipelines) into the masters."""
        for m, g in zip(self.params, grads_of(self.targets)):
            m.grad = g.detach().to(m.dtype, copy=True)

    def write_back(self) -> None:
        """The updated masters into the targets, in the targets' dtype; the masters' gradients
        are dropped (they last the step only: between steps a rank holds the half-precision
        gradients, as the cost model charges)."""
        with torch.no_grad():
            for t, m in zip(self.targets, self.params):
                t.copy_(m)
                m.grad = None

    def of(self, targets: Iterable[torch.Tensor]) -> list[torch.nn.Parameter]:
        return [self.master[t] for t in targets]

    def load_state(
        self,
        opt: torch.optim.Optimizer,
        state: dict[torch.Tensor, dict],
        values: dict[torch.Tensor, torch.Tensor],
    ) -> None:
        """A checkpoint's state and master values, keyed by target: each master takes its
        target's value and optimizer state."""
        with torch.no_grad():
            for t, m in zip(self.targets, self.params):
                if t in values:
                    m.copy_(values[t])
                if t in state:
                    opt.state[m] = state[t]


def lr_factor(step: int, opts: TrainOptions) -> float:
    """Learning-rate multiplier for the update after `step` updates: linear warm-up over
    `warmup_steps`, then constant, or a cosine / linear decay to `min_lr_ratio` at `decay_steps`
    (default `steps`)."""
    if step < opts.warmup_steps:
        return (step + 1) / opts.warmup_steps
    if opts.lr_schedule == "constant":
        return 1.0
    end = opts.decay_steps or opts.steps
    progress = min(1.0, (step - opts.warmup_steps) / max(1, end - opts.warmup_steps))
    shape = (
        0.5 * (1 + math.cos(math.pi * progress)) if opts.lr_schedule == "cosine" else 1 - progress
    )
    return opts.min_lr_ratio + (1 - opts.min_lr_ratio) * shape


def make_scheduler(opt: torch.optim.Optimizer, opts: TrainOptions, start: int) -> LambdaLR:
    """The schedule, positioned for the update after `start` completed steps (a resumed run)."""
    for g in opt.param_groups:
        g.setdefault("initial_lr", opts.lr)
    return LambdaLR(opt, lambda step: lr_factor(step, opts), last_epoch=start - 1)


def grads_of(params: Iterable[torch.nn.Parameter]) -> list[torch.Tensor]:
    out = []
    for p in params:
        if p.grad is None:  # a parameter that took no part in this step's forward
            p.grad = torch.zeros_like(p)
        out.append(p.grad)
    return out


def squared_norm(params: Iterable[torch.nn.Parameter], device: torch.device) -> torch.Tensor:
    """Sum of squared gradient entries, accumulated in float64 so partial sums from different ranks
    add up to the single-process value closely."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for g in grads_of(params):
        total += local_tensor(g).detach().double().pow(2).sum()  # a TP rank: its shard
    return total


def clip_coefficient(norm: float, max_norm: float) -> float:
    """`torch.nn.utils.clip_grad_norm_`'s factor: max_norm / (norm + 1e-6), at most 1."""
    return min(max_norm / (norm + 1e-6), 1.0)


def scale_grads(params: Iterable[torch.nn.Parameter], coef: float) -> None:
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)
