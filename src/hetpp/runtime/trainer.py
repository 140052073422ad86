"""One rank's training: find its (pipeline, stages), build them, run the schedule, sync, step.

Started once per plan device, by `torchrun -m hetpp.train` or by `hetpp train`'s local launcher
(both give rank and rendezvous through the environment), or forked by tests with a tcp:// address.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import pipelining
from torch.distributed.device_mesh import DeviceMesh

from hetpp.runtime import checkpoint
from hetpp.runtime.checkpoint_meta import check_resumable
from hetpp.runtime.contract import announce
from hetpp.runtime.data import batch, make_source, pipeline_slices, validation_rows
from hetpp.runtime.devices import pick_device
from hetpp.runtime.env import DistEnv
from hetpp.runtime.gradsync import GradSync
from hetpp.runtime.groups import Groups, RankMap, Role, plan_rank
from hetpp.runtime.guards import check_step
from hetpp.runtime.hf_weights import load_stage
from hetpp.runtime.lanes import LaneStage
from hetpp.runtime.memory import MemoryProbe
from hetpp.runtime.metrics import (
    MetricsLog,
    StepMetrics,
    pack_step,
    print_progress,
    print_summary,
    unpack_step,
)
from hetpp.runtime.model import RankModel, StageModule
from hetpp.runtime.optim import MasterWeights, make_optimizer, make_scheduler, scale_grads
from hetpp.runtime.options import TrainOptions
from hetpp.runtime.precision import LossScaler, Precision, has_nonfinite, scaled_loss
from hetpp.runtime.recompute import recompute_blocks
from hetpp.runtime.reference import VerifyReport, compare, stage_parameters, train_reference
from hetpp.runtime.shard import ShardedStep, WholeState, whole_state
from hetpp.runtime.stage import TimedStage
from hetpp.runtime.tp import GatheredStage, full_state, parallelize_stage
from hetpp.specs.cluster import emulate_slowdown
from hetpp.specs.errors import SpecError
from hetpp.specs.plan import Plan, load_plan


@dataclass(frozen=True)
class RunResult:
    records: list[StepMetrics]
    """Per-step metrics (rank 0; empty elsewhere)."""
    verify: VerifyReport | None
    """Rank 0 with --verify; None elsewhere."""


class Activity:
    """What this rank is doing now; a failure message names it."""

    def __init__(self) -> None:
        self.now = "starting"

    def __call__(self, what: str) -> None:
        self.now = what


def _device(env: DistEnv, plan: Plan, emulate: bool) -> tuple[torch.device, str]:
    device, backend = pick_device(plan, env.rank, env.local_rank, env.local_world_size, emulate)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // env.local_world_size))
    return device, backend


def _slowdown(plan: Plan, role: Role, opts: TrainOptions) -> float:
    if not opts.emulate:
        return 1.0
    if plan.cluster is None:
        raise SpecError("--emulate needs the plan's cluster (the `cluster` key)", field="cluster")
    return emulate_slowdown(plan.cluster, role.device)


def _resume(
    opts: TrainOptions,
    model: RankModel,
    opt: torch.optim.Optimizer,
    shards: ShardedStep | None,
    masters: MasterWeights | None,
) -> tuple[int, int, Path | None]:
    """(step, samples consumed, checkpoint path) to start from. Checkpoints hold whole
    parameters' optimizer state (and, for half-precision parameters, their fp32 masters); a
    sharded rank keeps its shards' slices, masters take their targets' values."""
    path = checkpoint.latest(opts.checkpoint_dir) if opts.resume and opts.checkpoint_dir else None
    if path is None:
        return 0, 0, None
    check_resumable(path, model.config.model_dump(mode="json"), opts.optimizer, opts.seed)
    # Sharded or with masters: every stage's whole state first, then this rank's part of it.
    whole = WholeState(dtype=None if masters is None else masters.dtype)
    direct = shards is None and masters is None
    for stage in model.stages:
        meta = checkpoint.load(path, stage, opt if direct else whole)
    if shards is not None:
        shards.load_state(opt, whole, masters)
    elif masters is not None:
        masters.load_state(opt, whole.state, whole.values)
    return meta.step, meta.samples, path


def _schedule_class(torch_class: str, stages: list[TimedStage]) -> tuple[type, object]:
    """The torch schedule class and what it is built with: one stage (single-stage schedules),
    or the list of this rank's stages (multi-stage ones: interleaved, zero-bubble, V)."""
    cls = getattr(pipelining, torch_class)
    single = issubclass(cls, pipelining.schedules.PipelineScheduleSingle)
    return cls, stages[0] if single else stages


def run(plan: Plan, opts: TrainOptions, env: DistEnv, activity: Activity) -> RunResult:
    """Train this rank's part of the plan; collective over all `plan.num_devices` ranks."""
    rank = plan_rank(plan, env.rank, env.world_size)
    if rank is None:
        print(f"hetpp rank {env.rank}: device {env.rank} is not in the plan; exiting", flush=True)
        return RunResult([], None)
    # The plan's ranks form the process group; a rank started for an unused device never joins.
    env = dataclasses.replace(env, rank=rank, world_size=plan.num_devices)
    device, backend = _device(env, plan, opts.emulate)
    activity("joining the process group")
    dist.init_process_group(
        backend,
        init_method=env.init_method,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=opts.timeout_s),
    )
    result = _trainer(plan)(plan, opts, env, activity, device).train()
    # Only after success: tearing down a group whose peer is gone can hang, and a failed rank
    # exits without it (see `main`).
    activity("leaving the process group")
    dist.destroy_process_group()
    return result


def _trainer(plan: Plan) -> type:
    """The pipelined trainer, or for a fully sharded plan the FSDP one (`runtime/fsdp.py`,
    imported here because it builds on `RankTrainer`)."""
    if plan.sharding == "full":
        from hetpp.runtime.fsdp import FsdpTrainer

        return FsdpTrainer
    return RankTrainer


class RankTrainer:
    """This rank's stages, schedule, optimizer and reductions, and the step loop."""

    def __init__(
        self, plan: Plan, opts: TrainOptions, env: DistEnv, activity: Activity, device: torch.device
    ):
        self.plan, self.opts, self.rank, self.note = plan, opts, env.rank, activity
        self.world, self.device = env.world_size, device
        self.ranks = ranks = RankMap.of(plan)
        self.role = role = ranks.role(env.rank)
        self.pipe = plan.pipelines[role.pipeline]
        activity("creating process groups")
        groups = Groups(ranks, self.rank, opts.timeout_s)
        self.precision = Precision.of(plan, opts.fp64)
        self.scaler = LossScaler(self.precision.loss_scaling)
        self.tp = len(role.tp_ranks) > 1
        """A TP rank (it runs one stage, `runtime/contract.py`)."""
        self.counts_loss = role.tp_index == 0
        """The loss is counted once per TP group (every rank of it computes the same)."""
        self.model = self.build_model(role, groups)
        self.sync = GradSync(
            ranks,
            self.rank,
            self.model,
            groups,
            device,
            self.precision.reduce_dtype,
            sharded=plan.optimizer_shards > 1,
        )
        self.shards = self.sync.sharded
        params, decays = self.optimizer_params()
        self.opt = make_optimizer(params, opts, decays)
        activity("loading the checkpoint")
        self.start, self.samples, self.resumed_from = _resume(
            opts, self.model, self.opt, self.shards, self.masters
        )
        self.sched = make_scheduler(self.opt, opts, self.start)
        # A pipeline with TP stages exchanges activations over its lanes' links (`runtime.lanes`)
        lanes = dict(links=role.links, p2p_group=groups.p2p) if role.p2p else {}
        self.pstages = [
            (LaneStage if lanes else TimedStage)(
                module,
                index,
                role.num_stages,
                device,
                group=groups.pipeline,
                slowdown=_slowdown(plan, role, opts),
                before_last_backward=lambda k=k: self.sync.arm(k),
                after_last_backward=lambda k=k: self.sync.finish(k),
                **lanes,
            )
            for k, (module, index) in enumerate(zip(self.model.stages, role.stages))
        ]
        if self.probe is not None:
            self.probe.watch(self.pstages)
        tokens = plan.global_batch * plan.seq_len
        cls, stages = _schedule_class(self.pipe.schedule_in(plan.train).torch_class, self.pstages)
        self.schedule = cls(
            stages,
            self.pipe.num_micro_batches,
            loss_fn=lambda out, tgt: scaled_loss(out, tgt, tokens, self.scaler.scale),
            scale_grads=False,  # the loss is already divided by the global token count
        )
        self.source = make_source(opts.data, plan, opts.seed)
        self.offset = pipeline_slices(plan)[role.pipeline][0]
        self.val = validation_rows(opts.data, plan, opts.seed, opts.eval_every, opts.eval_batches)
        self.first, self.last = role.first, role.last
        stages = ", ".join(map(str, role.stages))
        self.where = (
            f"pipeline schedule (pipeline {role.pipeline}, "
            f"ranks {list(role.chain)}, "
            f"stage{'s' if len(role.stages) > 1 else ''} {stages})"
        )

    def optimizer_params(
        self,
    ) -> tuple[list[torch.nn.Parameter], Callable[[torch.nn.Parameter], bool]]:
        """What the optimizer steps, with each one's weight-decay flag: the stage's parameters
        or this rank's shards of them (`runtime.shard`), or, for half-precision parameters,
        fp32 masters of those (`optim.MasterWeights`, set as `self.masters`)."""
        if self.shards is not None:
            params, flags = self.shards.optimizer_params(self.model.parameters())
            decays: Callable[[torch.nn.Parameter], bool] = flags.__getitem__
        else:
            params, decays = list(self.model.parameters()), lambda p: p.ndim >= 2
        self.masters = None
        if self.precision.master_dtype is None:
            return params, decays
        masters = self.masters = MasterWeights(params, self.precision.master_dtype)
        return masters.params, lambda m: decays(masters.target[m])

    def build_model(self, role: Role, groups: Groups) -> RankModel:
        """This rank's stages, one StageModule per owned layer range, initialised (or loaded from
        --init-from), moved to the device, in the plan's precision, split over the TP group
        (`runtime.tp`), recomputing where the plan's stage flag says."""
        plan, opts = self.plan, self.opts
        stages = [
            StageModule(plan.model, *layers, opts.seed, self.precision.param_dtype)
            for layers in role.layers
        ]
        model = RankModel(stages)  # ties a head to the embedding on this rank
        if opts.init_from:
            for stage in stages:
                load_stage(stage, opts.init_from)
        model.to(self.device)
        for stage in stages:
            self.precision.prepare(stage, self.device)
            if self.tp:
                parallelize_stage(stage, DeviceMesh.from_group(groups.tp, self.device.type))
        # --memory-report measures the rank's stages together, and counts the parameters as
        # the rank holds them (TP: its shards)
        self.probe = MemoryProbe(stages, self.device) if opts.memory_report else None
        for stage, index in zip(stages, role.stages):
            if self.pipe.stages[index].recomputes(plan.train):
                recompute_blocks(stage, self.probe.meter if self.probe else None)
        return model

    def train(self) -> RunResult:
        opts, plan = self.opts, self.plan
        log = MetricsLog(opts.metrics, self.start > 0, opts.tensorboard) if self.rank == 0 else None
        if log is not None:
            announce(
                plan,
                opts.emulate,
                self.ranks.devices,
                self.describe_precision(),
                self.start,
                self.resumed_from,
            )
        for step in range(self.start + 1, opts.steps + 1):
            times, loss, norm = self.step(step)
            self.note(f"step {step}: metrics all-reduce over all ranks")
            # One all-reduce per step: the loss (summed over the pipelines' last stages) and
            # every rank's seconds.
            packed = pack_step(loss, times, self.rank, self.world)
            vec = torch.tensor(packed, dtype=torch.float64, device=self.device)
            dist.all_reduce(vec)
            val = self.evaluate(step) if opts.eval_due(step) else None
            if log is not None:
                record = unpack_step(step, vec.tolist(), plan.global_batch, plan.seq_len, norm)
                log.add(dataclasses.replace(record, lr=self.lr, val_loss=val))
                print_progress(log.records[-1], opts.steps)
            check_step(step, vec[0].item(), norm)  # every rank sees the same numbers
            every = opts.checkpoint_every
            if opts.checkpoint_dir and (step == opts.steps or (every and step % every == 0)):
                self.save_checkpoint(step)
        self.settle()  # the parameters are read as trained from here on
        records = log.records if log is not None else []
        if self.probe is not None:
            self.note("gathering memory measurements")
            self.report_memory(log)
        if log is not None:
            log.close()
            if records:
                print_summary(records, list(self.ranks.devices))
        report = None
        if opts.verify:
            self.note("gathering parameters for --verify")
            report = self.verify(records)
        return RunResult(records, report)

    def describe_precision(self) -> str:
        """How the precision runs, for rank 0's start-up lines."""
        return self.precision.describe()

    def step(self, step: int) -> tuple[list[float], float, float | None]:
        """One optimizer step: ([compute, wait, comm, total] seconds, this rank's loss share,
        gradient norm before clipping)."""
        t0 = time.perf_counter()
        self.opt.zero_grad()
        if self.shards is not None or self.masters is not None:  # the optimizer has others
            self.model.zero_grad()
        args, target, losses = (), None, None
        if self.first or self.last:
            inputs, targets = batch(self.source, self.samples + self.offset, self.pipe.batch)
            args = (inputs.to(self.device),) if self.first else ()
            target = targets.to(self.device) if self.last else None
            losses = [] if self.last else None
        if self.probe is not None and step == self.start + 2:
            self.probe.reset(self.pstages)  # steady state: step 1 also runs the shape inference
        self.note(f"step {step}: {self.where}")
        with self.precision.step_region(self.device), self.probe_region():
            self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
        compute = sum(st.take_compute_s() for st in self.pstages)
        t_sched = time.perf_counter()
        self.sync.sync(lambda what: self.note(f"step {step}: {what}"))
        stepped = self.model.parameters()
        if self.masters is not None:  # unscaling and clipping act on the fp32 gradients
            self.masters.take_grads()
            stepped = self.masters.params
        scale, skip = self.scaler.scale, self.overflowed(step, stepped)
        norm = None
        if not skip:
            if scale != 1.0:
                scale_grads(stepped, 1.0 / scale)
            # The norm is always measured (a metric); without --clip-grad the factor is exactly 1.
            self.note(f"step {step}: gradient-norm all-reduce over all ranks")
            norm = self.sync.clip(self.opts.clip_grad or math.inf, self.model, self.masters)
        t_comm = time.perf_counter()
        self.lr = self.sched.get_last_lr()[0]  # this update's rate, for the metrics
        if not skip:
            self.opt.step()
            if self.masters is not None:
                self.masters.write_back()
            if self.shards is not None:  # the next forward's hooks wait for them (overlap)
                self.note(f"step {step}: all-gathers of the updated parameter shards issued")
                self.shards.gather()
        # The schedule counts steps, skipped (fp16 overflow) ones included, as the reference does.
        self.sched.step()
        self.scaler.update(skip)
        t_end = time.perf_counter()
        self.samples += self.plan.global_batch
        times = [compute + t_end - t_comm, t_sched - t0 - compute, t_comm - t_sched, t_end - t0]
        loss = sum(float(x.detach()) for x in losses or ()) / scale if self.counts_loss else 0.0
        return times, loss, norm

    def probe_region(self) -> contextlib.AbstractContextManager:
        return self.probe.region() if self.probe is not None else contextlib.nullcontext()

    def report_memory(self, log: MetricsLog | None) -> None:
        """Every rank's measured memory, gathered to rank 0 and written to --metrics (the CLI
        sets the cost model's prediction beside it)."""
        mine = self.probe.record(self.rank, self.role.device, self.pstages, self.model, self.opt)
        gathered: list | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        for record in gathered or ():
            log.write(record)

    def overflowed(self, step: int, params: Iterable[torch.nn.Parameter]) -> bool:
        """fp16: whether any rank's gradients of `params` (the summed ones the optimizer takes)
        hold an inf or NaN (one all-reduce, so that every rank skips the same steps); always
        False without loss scaling."""
        if not self.scaler.enabled:
            return False
        self.note(f"step {step}: inf/NaN check all-reduce over all ranks")
        flag = has_nonfinite(params, self.device)
        dist.all_reduce(flag)
        return bool(flag.item() > 0)

    def settle(self) -> None:
        """Sharded: wait for the step's all-gathers, which the next step's forward would wait
        for (`ShardedStep.finish`), before anything else reads the parameters."""
        if self.shards is not None:
            self.shards.finish()

    def evaluate(self, step: int) -> float:
        """Mean validation loss over `eval_batches` held-out global batches: forward only, through
        the same schedule and shapes as training; collective over all ranks."""
        self.note(f"step {step}: validation")
        self.settle()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        batch_size = self.plan.global_batch
        for k in range(self.opts.eval_batches):
            first = k * batch_size + self.offset
            rows = self.val[first : first + self.pipe.batch].to(self.device)
            args = (rows[:, :-1],) if self.first else ()
            losses: list | None = [] if self.last else None
            target = rows[:, 1:] if self.last else None
            with self.precision.step_region(self.device):
                self.schedule.eval(*args, target=target, losses=losses)
            # The loss function multiplies by the fp16 loss scale (1 otherwise).
            if self.counts_loss:
                total += sum(float(x.detach()) for x in losses or ()) / self.scaler.scale
        dist.all_reduce(total)
        return total.item() / self.opts.eval_batches

    def checkpoint_meta(self, step: int) -> checkpoint.CheckpointMeta:
        """What a checkpoint of this step records beside the layers."""
        return checkpoint.CheckpointMeta(
            step=step,
            samples=self.samples,
            seed=self.opts.seed,
            optimizer=self.opts.optimizer,
            model=self.plan.model.model_dump(mode="json"),
        )

    def save_checkpoint(self, step: int) -> None:
        self.note(f"step {step}: writing the checkpoint")
        self.settle()
        meta = self.checkpoint_meta(step)
        # Pipeline 0's stages cover every layer once; the other pipelines hold identical copies.
        # Sharded: the owners first gather the whole optimizer state (collective).
        # TP: the group gathers its stage (collective) and its rank 0 writes it.
        writes = self.model.layer_indices if self.role.pipeline == 0 else []
        model: checkpoint.Stage = self.model
        state: checkpoint.State = self.opt
        if self.shards is not None:
            state = self.shards.full_state(self.opt, self.model.parameters(), self.masters)
        elif self.masters is not None:  # keyed by parameter, the fp32 masters in their place
            state = whole_state(self.opt, self.model.parameters(), self.masters)
        elif self.tp and writes:
            model = state = GatheredStage(self.model.stages[0], self.opt)
            writes = writes if self.role.tp_index == 0 else []
        checkpoint.save(
            self.opts.checkpoint_dir, meta, model, state, writes, self.rank, dist.barrier
        )

    def verify(self, records: list[StepMetrics]) -> VerifyReport | None:
        """Rank 0 trains the same steps in one process and compares every copy of every
        parameter on every rank with it."""
        gathered: list | None = [None] * self.world if self.rank == 0 else None
        mine = full_state(self.model.stages[0]) if self.tp else stage_parameters(self.model)
        dist.gather_object(mine, gathered, dst=0)
        if gathered is None:
            return None
        ref = train_reference(self.plan, self.opts, self.resumed_from, self.device)
        report = compare(
            ref, gathered, [r.loss for r in records], self.opts.tolerance(self.precision.name)
        )
        print(report, flush=True)
        return report


def _root_cause(e: BaseException) -> str:
    """The innermost exception's first line: torch.distributed.pipelining wraps the gloo/NCCL
    error (which says which peer and which operation) in its own multi-line message."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0].strip() if lines else ''}"


def main(opts: TrainOptions, env: DistEnv) -> int:
    """Run one rank; 0 on success, 1 if --verify fails. A rank that fails prints what it was doing
    and exits at once (2 for bad input, 1 otherwise): waiting to tear down a process group whose
    peer is gone could hang."""
    plan = load_plan(opts.plan)
    activity = Activity()
    try:
        result = run(plan, opts, env, activity)
    except Exception as e:
        bad_input = isinstance(e, SpecError)
        why = str(e) if bad_input else _root_cause(e)
        print(
            f"hetpp rank {env.rank}: failed while {activity.now}: {why}",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(2 if bad_input else 1)
    return 0 if result.verify is None or result.verify.ok else 1
