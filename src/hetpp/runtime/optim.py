"""Optimizer construction and global-norm clipping arithmetic, shared by the pipeline run and the
single-process reference so both do exactly the same maths."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hetpp.runtime.options import TrainOptions


def make_optimizer(
    params: Iterable[torch.nn.Parameter], opts: TrainOptions
) -> torch.optim.Optimizer:
    if opts.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    return torch.optim.SGD(params, lr=opts.lr, weight_decay=opts.weight_decay)


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
        total += g.detach().double().pow(2).sum()
    return total


def clip_coefficient(norm: float, max_norm: float) -> float:
    """`torch.nn.utils.clip_grad_norm_`'s factor: max_norm / (norm + 1e-6), at most 1."""
    return min(max_norm / (norm + 1e-6), 1.0)


def scale_grads(params: Iterable[torch.nn.Parameter], coef: float) -> None:
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)
