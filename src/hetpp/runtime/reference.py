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
from hetpp.runtime.model import RankModel, StageModule
from hetpp.runtime.optim import (
    MasterWeights,
    clip_coefficient,
    grads_of,
    make_optimizer,
    make_scheduler,
    scale_grads,
    squared_norm,
)
from hetpp.runtime.options import TrainOptions
from hetpp.runtime.precision import LossScaler, Precision, has_nonfinite, scaled_loss
from hetpp.runtime.shard import WholeState
from hetpp.specs.plan import Plan


@dataclass(frozen=True)
class VerifyReport:
    """Pipelined run vs single-process reference."""

    max_param_diff: float
    """Largest |difference| over every parameter copy on every rank."""
    max_loss_diff: float
    """Largest |difference| of the per-step losses."""
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_param_diff <= self.tolerance and self.max_loss_diff <= self.tolerance

    def __str__(self) -> str:
        return (
            f"verify: max parameter difference {self.max_param_diff:.3g}, max loss difference "
            f"{self.max_loss_diff:.3g} (tolerance {self.tolerance:g}): "
            f"{'OK' if self.ok else 'FAILED'}"
        )


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
    device = device or torch.device("cpu")
    precision = Precision.of(plan, opts.fp64)
    model = StageModule(plan.model, 0, plan.layer_list_len, opts.seed, precision.param_dtype)
    if opts.init_from:
        load_stage(model, opts.init_from)
    model.to(device)
    precision.prepare(model, device)
    params = list(model.parameters())
    masters = None
    # Half-precision parameters with fp32 masters, as the runtime holds them. Under --fp64 the
    # masters would be float64 copies of float64 parameters: the same arithmetic as stepping
    # the parameters, which the reference then does, independent of `MasterWeights`.
    if precision.master_dtype not in (None, precision.param_dtype):
        masters = MasterWeights(params, precision.master_dtype)
        opt = make_optimizer(masters.params, opts, lambda m: masters.target[m].ndim >= 2)
        stepped = masters.params
    else:
        opt = make_optimizer(params, opts)
        stepped = params
    scaler = LossScaler(precision.loss_scaling)
    start = samples = 0
    if resume_from is not None:
        whole = WholeState(dtype=precision.master_dtype)
        meta = checkpoint.load(resume_from, model, opt if masters is None else whole)
        if masters is not None:
            masters.load_state(opt, whole.state, whole.values)
        start, samples = meta.step, meta.samples
    source = make_source(opts.data, plan, opts.seed)
    sched = make_scheduler(opt, opts, start)
    losses = []
    for _ in range(start, opts.steps):
        opt.zero_grad()
        scale = scaler.scale
        with precision.step_region(device):
            losses.append(_accumulate(model, plan, precision, scale, source, samples, device))
        if masters is not None:
            masters.take_grads()
        skip = scaler.enabled and bool(has_nonfinite(stepped, device).item() > 0)
        if not skip:
            if scale != 1.0:
                scale_grads(stepped, 1.0 / scale)
            if opts.clip_grad is not None:
                norm = math.sqrt(squared_norm(stepped, device).item())
                scale_grads(stepped, clip_coefficient(norm, opts.clip_grad))
            opt.step()
            if masters is not None:
                masters.write_back()
        sched.step()  # counts skipped steps too, as the runtime does
        scaler.update(skip)
        samples += plan.global_batch
    return ReferenceRun(model, losses)


def _accumulate(
    model: StageModule,
    plan: Plan,
    precision: Precision,
    scale: float,
    source: TokenSource,
    samples: int,
    device: torch.device,
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
            mb_loss = scaled_loss(model(inputs), targets, tokens, scale)
            mb_loss.backward()
            pipe_loss += mb_loss.item()
        loss += pipe_loss
        # With several pipelines, each one's gradients cross the wire in the reduce dtype.
        wire = precision.reduce_dtype if len(plan.pipelines) > 1 else precision.param_dtype
        grads = [g.detach().to(wire, copy=True) for g in grads_of(params)]
        total = grads if total is None else [t.add_(g) for t, g in zip(total, grads)]
    assert total is not None  # a plan has at least one pipeline
    for p, g in zip(params, total):
        p.grad = g.to(precision.param_dtype)
    return loss / scale


def stage_parameters(model: RankModel) -> dict[tuple[int, str], torch.Tensor]:
    """Every parameter of a rank's stages keyed by (layer index, name), tied copies included, on
    the CPU: what --verify gathers from each rank."""
    return {
        (i, n): p.detach().cpu()
        for i in model.layer_indices
        for n, p in model.layer(i).named_parameters(remove_duplicate=False)
    }


def compare(
    ref: ReferenceRun,
    gathered: list[dict[tuple[int, str], torch.Tensor]],
    losses: list[float],
    tolerance: float,
) -> VerifyReport:
    """The reference against every rank's `stage_parameters` and the pipelined run's losses."""
    diff = 0.0
    for params in gathered:
        for (i, name), value in params.items():
            want = ref.model.layer(i).get_parameter(name).detach().cpu()
            diff = max(diff, (value - want).abs().max().item())
    loss_diff = max((abs(a - b) for a, b in zip(losses, ref.losses)), default=0.0)
    return VerifyReport(diff, loss_diff, tolerance)
