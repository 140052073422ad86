"""Single-process training of the same steps on the same global batch: the referee for --verify and
the equivalence tests. Same initial weights, data, optimizer and clipping as the pipelined run.

Why it mirrors the runtime's micro-batches: a single backward over the whole batch sums the
per-sample gradients in an order the CPU's GEMM kernels choose (AVX2, AVX-512 and ARM differ), and
AdamW's first step divides a gradient entry by (|g| + eps), which turns float32 rounding of entries
below eps (1e-8) into parameter differences up to lr / eps = 1e5 times larger. So the reference
does what each pipeline does: forward and backward of pipeline p's micro-batches, in order, with
the micro-batch size the plan gives, accumulating into the gradients; then it adds the pipelines'
gradients in pipeline order. Every per-micro-batch gradient is then bit-identical to the runtime's,
and what is left is the rounding of the final cross-pipeline sum and of the tied-weight sum, which
is far below the float32 tolerance even after AdamW's amplification."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from hetpp.runtime import checkpoint
from hetpp.runtime.data import TokenSource, batch, make_source, pipeline_slices
from hetpp.runtime.hf_weights import load_stage
from hetpp.runtime.model import StageModule, token_loss_sum
from hetpp.runtime.optim import (
    clip_coefficient,
    grads_of,
    make_optimizer,
    make_scheduler,
    scale_grads,
    squared_norm,
)
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
    model = StageModule(plan.model, 0, plan.num_layers, opts.seed, dtype)
    if opts.init_from:
        load_stage(model, opts.init_from)
    model.to(device)
    opt = make_optimizer(model.parameters(), opts)
    start = samples = 0
    if resume_from is not None:
        meta = checkpoint.load(resume_from, model, opt)
        start, samples = meta.step, meta.samples
    source = make_source(opts.data, plan, opts.seed)
    sched = make_scheduler(opt, opts, start)
    losses = []
    for _ in range(start, opts.steps):
        opt.zero_grad()
        losses.append(_accumulate(model, plan, source, samples, device))
        if opts.clip_grad is not None:
            norm = math.sqrt(squared_norm(model.parameters(), device or torch.device("cpu")).item())
            scale_grads(model.parameters(), clip_coefficient(norm, opts.clip_grad))
        opt.step()
        sched.step()
        samples += plan.global_batch
    return ReferenceRun(model, losses)


def _accumulate(
    model: StageModule,
    plan: Plan,
    source: TokenSource,
    samples: int,
    device: torch.device | None,
) -> float:
    """Gradients of one step as the pipelines compute them (see the module docstring): each
    pipeline's micro-batches in order, then the pipelines' sums added in pipeline order. Returns
    the step's loss (mean over the global batch's tokens)."""
    params = list(model.parameters())
    tokens = plan.global_batch * plan.seq_len
    total: list[torch.Tensor] | None = None
    loss = 0.0
    for pipe, (offset, _) in zip(plan.pipelines, pipeline_slices(plan)):
        for p in params:
            p.grad = None
        pipe_loss = 0.0
        for k in range(pipe.num_micro_batches):
            first = samples + offset + k * pipe.micro_batch_size
            inputs, targets = (t.to(device) for t in batch(source, first, pipe.micro_batch_size))
            mb_loss = token_loss_sum(model(inputs), targets) / tokens
            mb_loss.backward()
            pipe_loss += mb_loss.item()
        loss += pipe_loss
        grads = [g.detach().clone() for g in grads_of(params)]
        total = grads if total is None else [t.add_(g) for t, g in zip(total, grads)]
    assert total is not None  # a plan has at least one pipeline
    for p, g in zip(params, total):
        p.grad = g
    return loss
