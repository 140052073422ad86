"""One rank of a fully sharded plan (`sharding: full`): heterogeneous FSDP with FSDP2.

Every rank builds the whole model (same weights: each layer seeds its own generator), applies
`fully_shard` to each transformer block and then to the root (the embedding, the head and a
tied weight: one unit), and trains on its own batch share: `num_micro_batches` micro-batches of
its own `micro_batch_size`, one after the other, forward and backward each. Every rank runs the
same number of micro-batches, since each one's forward and backward gather every unit on every
rank. Gradients are reduce-scattered as sums (divide factor 1): the loss is the token sum over
the global token count, so the summed shards are the full-batch mean gradient, as in the
pipelined runtime.

Precision: the parameters are the plan's master dtype (float32; float64 with --fp64), sharded.
bf16 plans gather and compute in bf16 (FSDP2's `MixedPrecisionPolicy(param_dtype=bf16)`) and
reduce in the dtype `grad_bytes_per_param` names; fp32 and fp64 run without a policy, exactly.
fp16 (loss scaling), --emulate and --memory-report are not built for this path and are refused.

Clipping: the global norm is the float64 sum of every rank's squared local shard entries (each
entry lives on exactly one rank), all-reduced. Checkpoints gather to full tensors: every rank
takes part in the gathers, rank 0 writes the plan-independent per-layer format
(`runtime/checkpoint.py`), so an FSDP run resumes under a pipelined plan and back; resuming
loads the full state into every rank before sharding it.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from hetpp.runtime import checkpoint
from hetpp.runtime.checkpoint_meta import check_resumable
from hetpp.runtime.data import batch, make_source, pipeline_slices, validation_rows
from hetpp.runtime.env import DistEnv
from hetpp.runtime.groups import RankMap
from hetpp.runtime.hf_weights import load_stage
from hetpp.runtime.model import StageModule
from hetpp.runtime.optim import clip_coefficient, make_optimizer, make_scheduler, scale_grads
from hetpp.runtime.options import TrainOptions
from hetpp.runtime.precision import Precision, scaled_loss
from hetpp.runtime.recompute import recompute_blocks
from hetpp.runtime.reference import VerifyReport, compare, train_reference
from hetpp.runtime.trainer import RankTrainer
from hetpp.specs.errors import SpecError
from hetpp.specs.plan import Plan


def shard(model: StageModule, world: int, device: torch.device, precision: Precision) -> None:
    """`fully_shard` each block, then the root (embedding, head, tied weight), over all ranks;
    gradients summed, not averaged."""
    mesh = init_device_mesh(device.type, (world,))
    policy = MixedPrecisionPolicy(
        param_dtype=precision.compute_dtype,
        reduce_dtype=precision.reduce_dtype if precision.compute_dtype else None,
    )
    for i in range(1, model.config.head_index):
        fully_shard(model.layer(i), mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM


def full_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Collective: every parameter and its optimizer state as full tensors (by name), on the
    CPU."""
    params, states = {}, {}
    for name, p in model.named_parameters():
        params[name] = _full(p.detach())
        states[name] = {k: _full(v) for k, v in opt.state.get(p, {}).items()}
    return params, states


def _full(t):
    return t.full_tensor().cpu() if isinstance(t, DTensor) else t.cpu() if torch.is_tensor(t) else t


def describe(precision: Precision) -> str:
    """How this precision runs under FSDP2, for rank 0's start-up lines."""
    reduce = str(precision.reduce_dtype).removeprefix("torch.")
    master = str(precision.param_dtype).removeprefix("torch.")
    if precision.compute_dtype is None:
        return f"{precision.name}: sharded {master} parameters, {reduce} reduce-scatters"
    half = str(precision.compute_dtype).removeprefix("torch.")
    return (
        f"{precision.name}: FSDP2 MixedPrecisionPolicy, {half} gathered parameters and "
        f"compute, sharded {master} master weights, {reduce} reduce-scatters"
    )


def _check_supported(opts: TrainOptions) -> None:
    """Options this path does not run (fp16 is refused by `contract.check_executable`)."""
    for flag, on in (("--emulate", opts.emulate), ("--memory-report", opts.memory_report)):
        if on:
            raise SpecError(f"{flag} is not built for sharding 'full'", field="sharding")


class FsdpTrainer(RankTrainer):
    """This rank's sharded model, optimizer and batch share; the step loop is `RankTrainer`'s
    (metrics, validation, guards, checkpoints, --verify), the step, evaluation, checkpoint and
    verification are this module's."""

    def __init__(self, plan: Plan, opts: TrainOptions, env: DistEnv, note, device: torch.device):
        self.plan, self.opts, self.rank, self.note = plan, opts, env.rank, note
        self.world, self.device = env.world_size, device
        self.precision = precision = Precision.of(plan, opts.fp64)
        _check_supported(opts)
        self.ranks = RankMap.of(plan)
        role = self.ranks.role(env.rank)
        self.pipe = plan.pipelines[role.pipeline]
        model = StageModule(plan.model, 0, plan.layer_list_len, opts.seed, precision.param_dtype)
        if opts.init_from:
            load_stage(model, opts.init_from)
        model.to(device)
        self.start, self.samples, self.resumed_from, loaded = self._resume(model)
        if self.pipe.stages[0].recomputes(plan.train):
            recompute_blocks(model)
        note("sharding the model")
        shard(model, self.world, device, precision)
        self.model = model
        self.opt = make_optimizer(model.parameters(), opts)
        self._shard_optimizer_state(loaded)
        self.sched = make_scheduler(self.opt, opts, self.start)
        self.source = make_source(opts.data, plan, opts.seed)
        self.offset = pipeline_slices(plan)[role.pipeline][0]
        self.val = validation_rows(opts.data, plan, opts.seed, opts.eval_every, opts.eval_batches)
        self.lr = opts.lr
        self.probe = None  # --memory-report is refused above
        self.shards = None  # FSDP shards itself: no ZeRO-1 all-gathers to settle

    def _resume(self, model: StageModule):
        """Load the newest checkpoint into the unsharded model (every rank reads it whole)."""
        opts = self.opts
        path = (
            checkpoint.latest(opts.checkpoint_dir) if opts.resume and opts.checkpoint_dir else None
        )
        if path is None:
            return 0, 0, None, {}
        check_resumable(path, model.config.model_dump(mode="json"), opts.optimizer, opts.seed)
        tmp = make_optimizer(model.parameters(), opts)
        meta = checkpoint.load(path, model, tmp)
        loaded = {n: tmp.state[p] for n, p in model.named_parameters() if p in tmp.state}
        return meta.step, meta.samples, path, loaded

    def _shard_optimizer_state(self, loaded: dict) -> None:
        """Resume: each full optimizer state tensor sharded like its parameter."""
        for name, p in self.model.named_parameters():
            if name in loaded:
                self.opt.state[p] = {
                    k: distribute_tensor(v.to(p.device, p.dtype), p.device_mesh, p.placements)
                    if torch.is_tensor(v) and v.ndim
                    else v
                    for k, v in loaded[name].items()
                }

    def describe_precision(self) -> str:
        return describe(self.precision)

    def step(self, step: int) -> tuple[list[float], float, float]:
        """One optimizer step: ([compute, wait, comm, total] seconds: the forward/backward with
        FSDP's collectives inside it, nothing, the norm all-reduce), loss share, gradient norm."""
        t0 = time.perf_counter()
        self.opt.zero_grad()
        self.note(f"step {step}: forward and backward with FSDP all-gathers and reduce-scatters")
        inputs, targets = batch(self.source, self.samples + self.offset, self.pipe.batch)
        tokens = self.plan.global_batch * self.plan.seq_len
        mbs, loss = self.pipe.micro_batch_size, 0.0
        for k in range(self.pipe.num_micro_batches):
            x = inputs[k * mbs : (k + 1) * mbs].to(self.device)
            y = targets[k * mbs : (k + 1) * mbs].to(self.device)
            mb_loss = scaled_loss(self.model(x), y, tokens, 1.0)
            mb_loss.backward()
            loss += mb_loss.item()
        t_bwd = time.perf_counter()
        self.note(f"step {step}: gradient-norm all-reduce over all ranks")
        norm = self.clip(self.opts.clip_grad or math.inf)
        t_comm = time.perf_counter()
        self.lr = self.sched.get_last_lr()[0]
        self.opt.step()
        self.sched.step()
        t_end = time.perf_counter()
        self.samples += self.plan.global_batch
        return [t_bwd - t0 + t_end - t_comm, 0.0, t_comm - t_bwd, t_end - t0], loss, norm

    def clip(self, max_norm: float) -> float:
        """The exact global gradient norm (each shard entry counted on its one rank), and the
        gradients scaled by `clip_coefficient` (exactly 1 without --clip-grad)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in params:
            total += p.grad.to_local().detach().double().pow(2).sum()
        dist.all_reduce(total)
        norm = math.sqrt(total.item())
        coef = clip_coefficient(norm, max_norm)
        if coef != 1.0:
            scale_grads(params, coef)
        return norm

    def evaluate(self, step: int) -> float:
        """Mean validation loss over held-out global batches (each rank its share); collective."""
        self.note(f"step {step}: validation")
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        tokens, mbs = self.plan.global_batch * self.plan.seq_len, self.pipe.micro_batch_size
        with torch.no_grad():
            for k in range(self.opts.eval_batches):
                first = k * self.plan.global_batch + self.offset
                rows = self.val[first : first + self.pipe.batch].to(self.device)
                for j in range(self.pipe.num_micro_batches):
                    mb = rows[j * mbs : (j + 1) * mbs]
                    total += scaled_loss(self.model(mb[:, :-1]), mb[:, 1:], tokens, 1.0).double()
        dist.all_reduce(total)
        return total.item() / self.opts.eval_batches

    def _full_model(self) -> tuple[StageModule, torch.optim.Optimizer] | None:
        """Collective: the whole model and optimizer state, unsharded, on rank 0 (None
        elsewhere)."""
        params, states = full_state(self.model, self.opt)
        if self.rank != 0:
            return None
        plan, dtype = self.plan, self.precision.param_dtype
        full = StageModule(plan.model, 0, plan.layer_list_len, self.opts.seed, dtype)
        opt = make_optimizer(full.parameters(), self.opts)
        with torch.no_grad():
            for name, p in full.named_parameters():
                p.copy_(params[name])
                if states[name]:
                    opt.state[p] = states[name]
        return full, opt

    def save_checkpoint(self, step: int) -> None:
        self.note(f"step {step}: gathering and writing the checkpoint")
        got = self._full_model()
        meta = self.checkpoint_meta(step)
        stage, opt = got if got is not None else (self.model, self.opt)
        writes = list(range(self.plan.layer_list_len)) if got is not None else []
        checkpoint.save(self.opts.checkpoint_dir, meta, stage, opt, writes, self.rank, dist.barrier)

    def verify(self, records) -> VerifyReport | None:
        """Rank 0 trains the same steps in one process and compares the gathered parameters."""
        self.note("gathering parameters for --verify")
        params, _ = full_state(self.model, self.opt)
        if self.rank != 0:
            return None
        gathered = {}
        for name, value in params.items():
            layer, rest = name.removeprefix("layers.").split(".", 1)
            gathered[(int(layer), rest)] = value
        ref = train_reference(self.plan, self.opts, self.resumed_from, self.device)
        report = compare(
            ref, [gathered], [r.loss for r in records], self.opts.tolerance(self.precision.name)
        )
        print(report, flush=True)
        return report
