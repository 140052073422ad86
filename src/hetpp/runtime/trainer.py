"""One rank's training: find its (pipeline, stage), build the stage, run the schedule, sync, step.

Started once per plan device, by `torchrun -m hetpp.train` or by `hetpp train`'s local launcher
(both give rank and rendezvous through the environment), or forked by tests with a tcp:// address.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

from hetpp.runtime import checkpoint
from hetpp.runtime.checkpoint_meta import check_resumable
from hetpp.runtime.data import batch, make_source, pipeline_slices
from hetpp.runtime.devices import pick_device
from hetpp.runtime.gradsync import GradSync
from hetpp.runtime.groups import Groups, Role, pipeline_ranks, plan_devices, role_of
from hetpp.runtime.guards import check_step
from hetpp.runtime.metrics import MetricsLog, StepMetrics, print_summary
from hetpp.runtime.model import StageModule, token_loss_sum
from hetpp.runtime.optim import make_optimizer
from hetpp.runtime.options import TrainOptions
from hetpp.runtime.reference import train_reference
from hetpp.runtime.stage import TimedStage
from hetpp.specs.cluster import emulate_slowdown
from hetpp.specs.errors import SpecError
from hetpp.specs.plan import Plan, load_plan


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    """Where this process sits in the job and how it meets the others."""

    rank: int
    world_size: int
    local_rank: int = 0
    """Index among the processes of this node (picks the GPU)."""
    local_world_size: int = 1
    """Processes on this node (CPU threads are shared among them)."""
    init_method: str = "env://"
    """Rendezvous: env:// (MASTER_ADDR/MASTER_PORT, as torchrun sets) or tcp://host:port."""

    @classmethod
    def from_environ(cls) -> DistEnv:
        env = os.environ
        try:
            return cls(
                rank=int(env["RANK"]),
                world_size=int(env["WORLD_SIZE"]),
                local_rank=int(env.get("LOCAL_RANK", 0)),
                local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            )
        except KeyError as e:
            raise SpecError(
                f"{e.args[0]} is not set; start ranks with torchrun or `hetpp train`",
                field="environment",
            ) from None


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
    opts: TrainOptions, stage: StageModule, opt: torch.optim.Optimizer
) -> tuple[int, int, Path | None]:
    """(step, samples consumed, checkpoint path) to start from."""
    path = checkpoint.latest(opts.checkpoint_dir) if opts.resume and opts.checkpoint_dir else None
    if path is None:
        return 0, 0, None
    check_resumable(path, stage.config.model_dump(mode="json"), opts.optimizer, opts.seed)
    meta = checkpoint.load(path, stage, opt)
    return meta.step, meta.samples, path


def run(plan: Plan, opts: TrainOptions, env: DistEnv, activity: Activity) -> RunResult:
    """Train this rank's part of the plan; collective over all `plan.num_devices` ranks."""
    if env.world_size != plan.num_devices:
        raise SpecError(
            f"the plan uses {plan.num_devices} devices but {env.world_size} ranks were started",
            field="pipelines",
        )
    device, backend = _device(env, plan, opts.emulate)
    activity("joining the process group")
    dist.init_process_group(
        backend,
        init_method=env.init_method,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=opts.timeout_s),
    )
    result = RankTrainer(plan, opts, env, activity, device).train()
    # Only after success: tearing down a group whose peer is gone can hang, and a failed rank
    # exits without it (see `main`).
    activity("leaving the process group")
    dist.destroy_process_group()
    return result


class RankTrainer:
    """This rank's stage, schedule, optimizer and reductions, and the step loop."""

    def __init__(
        self, plan: Plan, opts: TrainOptions, env: DistEnv, activity: Activity, device: torch.device
    ):
        self.plan, self.opts, self.rank, self.note = plan, opts, env.rank, activity
        self.world, self.device = env.world_size, device
        self.role = role = role_of(plan, env.rank)
        self.pipe = plan.pipelines[role.pipeline]
        activity("creating process groups")
        groups = Groups(plan, self.rank, opts.timeout_s)
        self.stage = StageModule(plan.model, *role.layers, opts.seed, getattr(torch, opts.dtype))
        self.stage.to(device)
        self.opt = make_optimizer(self.stage.parameters(), opts)
        activity("loading the checkpoint")
        self.start, self.samples, self.resumed_from = _resume(opts, self.stage, self.opt)
        self.sync = GradSync(plan, self.rank, self.stage, groups, device)
        self.pstage = TimedStage(
            self.stage,
            role.stage,
            role.num_stages,
            device,
            group=groups.pipeline,
            slowdown=_slowdown(plan, role, opts),
            before_last_backward=self.sync.arm,
        )
        tokens = plan.global_batch * plan.seq_len
        self.schedule = (Schedule1F1B if plan.schedule == "1f1b" else ScheduleGPipe)(
            self.pstage,
            self.pipe.num_micro_batches,
            loss_fn=lambda out, tgt: token_loss_sum(out, tgt) / tokens,
            scale_grads=False,  # the loss is already divided by the global token count
        )
        self.source = make_source(opts.data, plan, opts.seed)
        self.offset = pipeline_slices(plan)[role.pipeline][0]
        self.first, self.last = role.stage == 0, role.stage == role.num_stages - 1
        ranks = list(pipeline_ranks(plan)[role.pipeline])
        self.where = (
            f"pipeline schedule (pipeline {role.pipeline}, ranks {ranks}, stage {role.stage})"
        )

    def train(self) -> RunResult:
        opts, plan = self.opts, self.plan
        log = MetricsLog(opts.metrics, append=self.start > 0) if self.rank == 0 else None
        if log is not None:
            _announce(plan, opts, self.start, self.resumed_from)
        for step in range(self.start + 1, opts.steps + 1):
            times, loss, norm = self.step(step)
            self.note(f"step {step}: metrics all-reduce over all ranks")
            # One all-reduce per step: the loss (summed over the pipelines' last stages) and
            # every rank's (compute, wait, comm, total) seconds.
            vec = torch.zeros(1 + 4 * self.world, dtype=torch.float64, device=self.device)
            vec[0] = loss
            vec[1 + 4 * self.rank : 5 + 4 * self.rank] = torch.tensor(times)
            dist.all_reduce(vec)
            if log is not None:
                log.add(_step_metrics(step, vec.tolist(), self.world, plan, norm))
                _progress(log.records[-1], opts.steps)
            check_step(step, vec[0].item(), norm)  # every rank sees the same numbers
            every = opts.checkpoint_every
            if opts.checkpoint_dir and (step == opts.steps or (every and step % every == 0)):
                self.save_checkpoint(step)
        records = log.records if log is not None else []
        if log is not None:
            log.close()
            if records:
                print_summary(records, plan_devices(plan))
        report = None
        if opts.verify:
            self.note("gathering parameters for --verify")
            report = self.verify(records)
        return RunResult(records, report)

    def step(self, step: int) -> tuple[list[float], float, float | None]:
        """One optimizer step: ([compute, wait, comm, total] seconds, this rank's loss share,
        gradient norm before clipping)."""
        t0 = time.perf_counter()
        self.opt.zero_grad()
        self.pstage.compute_s = 0.0
        args, target, losses = (), None, None
        if self.first or self.last:
            inputs, targets = batch(self.source, self.samples + self.offset, self.pipe.batch)
            args = (inputs.to(self.device),) if self.first else ()
            target = targets.to(self.device) if self.last else None
            losses = [] if self.last else None
        self.note(f"step {step}: {self.where}")
        self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
        t_sched = time.perf_counter()
        self.sync.sync(lambda what: self.note(f"step {step}: {what}"))
        norm = None
        if self.opts.clip_grad is not None:
            self.note(f"step {step}: gradient-norm all-reduce over all ranks")
            norm = self.sync.clip(self.opts.clip_grad, self.stage)
        t_comm = time.perf_counter()
        self.opt.step()
        t_end = time.perf_counter()
        self.samples += self.plan.global_batch
        compute = self.pstage.compute_s
        times = [compute + t_end - t_comm, t_sched - t0 - compute, t_comm - t_sched, t_end - t0]
        return times, sum(float(x.detach()) for x in losses or ()), norm

    def save_checkpoint(self, step: int) -> None:
        self.note(f"step {step}: writing the checkpoint")
        meta = checkpoint.CheckpointMeta(
            step=step,
            samples=self.samples,
            seed=self.opts.seed,
            optimizer=self.opts.optimizer,
            model=self.plan.model.model_dump(mode="json"),
        )
        # Pipeline 0's stages cover every layer once; the other pipelines hold identical copies.
        writes = list(range(*self.role.layers)) if self.role.pipeline == 0 else []
        checkpoint.save(
            self.opts.checkpoint_dir, meta, self.stage, self.opt, writes, self.rank, dist.barrier
        )

    def verify(self, records: list[StepMetrics]) -> VerifyReport | None:
        """Rank 0 trains the same steps in one process and compares every copy of every
        parameter on every rank with it."""
        stage = self.stage
        mine = {
            (i, n): p.detach().cpu()
            for i in range(stage.start, stage.end)
            for n, p in stage.layer(i).named_parameters(remove_duplicate=False)
        }
        gathered: list | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if gathered is None:
            return None
        ref = train_reference(self.plan, self.opts, self.resumed_from, self.device)
        diff = 0.0
        for params in gathered:
            for (i, name), value in params.items():
                want = ref.model.layer(i).get_parameter(name).detach().cpu()
                diff = max(diff, (value - want).abs().max().item())
        loss_diff = max((abs(r.loss - x) for r, x in zip(records, ref.losses)), default=0.0)
        report = VerifyReport(diff, loss_diff, self.opts.tolerance)
        print(
            f"verify: max parameter difference {diff:.3g}, max loss difference {loss_diff:.3g} "
            f"(tolerance {report.tolerance:g}): {'OK' if report.ok else 'FAILED'}",
            flush=True,
        )
        return report


def _step_metrics(
    step: int, vec: list[float], world: int, plan: Plan, norm: float | None
) -> StepMetrics:
    per = [vec[1 + 4 * r : 5 + 4 * r] for r in range(world)]
    step_s = max(p[3] for p in per)
    return StepMetrics(
        step=step,
        loss=vec[0],
        step_s=step_s,
        grad_norm=norm,
        samples_per_s=plan.global_batch / step_s,
        tokens_per_s=plan.global_batch * plan.seq_len / step_s,
        compute_s=tuple(p[0] for p in per),
        wait_s=tuple(p[1] for p in per),
        comm_s=tuple(p[2] for p in per),
    )


def _announce(plan: Plan, opts: TrainOptions, start: int, resumed_from: Path | None) -> None:
    shapes = "; ".join(
        f"pipeline {p}: {len(pipe.stages)} stage(s) on devices {pipe.devices}, batch {pipe.batch} "
        f"({pipe.num_micro_batches} x {pipe.micro_batch_size})"
        for p, pipe in enumerate(plan.pipelines)
    )
    print(
        f"hetpp train: {plan.model.name}, {plan.num_devices} ranks, {plan.schedule}; {shapes}",
        flush=True,
    )
    if resumed_from is not None:
        print(f"resumed from {resumed_from} at step {start}", flush=True)
    if opts.emulate and plan.cluster is not None:
        factors = ", ".join(
            f"{d}: x{emulate_slowdown(plan.cluster, d):g}" for d in plan_devices(plan)
        )
        print(f"emulating device slowdowns {factors}", flush=True)


def _progress(m: StepMetrics, steps: int) -> None:
    print(
        f"step {m.step}/{steps}  loss {m.loss:.4f}  {m.step_s * 1e3:.1f} ms  "
        f"{m.samples_per_s:.1f} samples/s  {m.tokens_per_s:.0f} tokens/s",
        flush=True,
    )


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
