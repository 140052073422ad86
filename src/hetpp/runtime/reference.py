"""Single-process training of the same steps on the full global batch: the referee for --verify and
the equivalence tests. Same initial weights, data, optimizer and clipping as the pipelined run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from hetpp.runtime import checkpoint
from hetpp.runtime.data import batch, make_source
from hetpp.runtime.model import StageModule, token_loss_sum
from hetpp.runtime.optim import clip_coefficient, make_optimizer, scale_grads, squared_norm
from hetpp.runtime.options import TrainOptions
from hetpp.specs.plan import Plan


@dataclass(frozen=True)
class ReferenceRun:
    """The model after training and the loss of each step."""

    model: StageModule
    """All layers (a tied head shares the embedding's weight)."""
    losses: list[float]
    """Mean token loss per step, steps start+1 .. opts.steps."""


def train_reference(
    plan: Plan,
    opts: TrainOptions,
    resume_from: str | Path | None = None,
    device: torch.device | None = None,
) -> ReferenceRun:
    dtype = getattr(torch, opts.dtype)
    model = StageModule(plan.model, 0, plan.num_layers, opts.seed, dtype).to(device)
    opt = make_optimizer(model.parameters(), opts)
    start = samples = 0
    if resume_from is not None:
        meta = checkpoint.load(resume_from, model, opt)
        start, samples = meta.step, meta.samples
    source = make_source(opts.data, plan, opts.seed)
    tokens = plan.global_batch * plan.seq_len
    losses = []
    for _ in range(start, opts.steps):
        inputs, targets = (t.to(device) for t in batch(source, samples, plan.global_batch))
        opt.zero_grad()
        loss = token_loss_sum(model(inputs), targets) / tokens
        loss.backward()
        if opts.clip_grad is not None:
            norm = math.sqrt(squared_norm(model.parameters(), inputs.device).item())
            scale_grads(model.parameters(), clip_coefficient(norm, opts.clip_grad))
        opt.step()
        samples += plan.global_batch
        losses.append(loss.item())
    return ReferenceRun(model, losses)
