"""What the runtime can execute of a plan, checked before any rank starts.

A plan is data the planner, the simulator and the runtime all read; the runtime must not quietly
run something else than it says. `check_executable` names the first field it cannot honour
(SpecError: `hetpp train` exits 2 before launching, a torchrun rank before joining the group).
No torch here: the launcher runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hetpp.specs.cluster import emulate_slowdown
from hetpp.specs.errors import SpecError
from hetpp.specs.plan import Plan
from hetpp.specs.schedule import SCHEDULES

REDUCE_BYTES = (2, 4)
"""Gradient all-reduce element sizes the runtime has a dtype for (bf16/fp16, fp32)."""


def check_executable(plan: Plan, fp64: bool = False) -> None:
    """Raise SpecError naming the first plan field the runtime cannot execute as written. The
    plan's own validation already limits the schedule to the registry (each entry names the torch
    class the runtime runs and whether the runtime executes it); a TP stage runs one stage per
    device."""
    train = plan.train
    _check_tp(plan)
    if plan.sharding == "full" and train.precision == "fp16":
        raise SpecError(
            "fp16 (dynamic loss scaling) is not built for sharding 'full'; use bf16 or fp32",
            field="train.precision",
        )
    for p in range(len(plan.pipelines)):
        _check_schedule(plan, p)
    if train.grad_bytes_per_param not in REDUCE_BYTES:
        raise SpecError(
            f"{train.grad_bytes_per_param}: the runtime all-reduces gradients in 2 (bf16/fp16) "
            "or 4 (fp32) bytes",
            field="train.grad_bytes_per_param",
        )
    if plan.optimizer_shards > 1 and train.precision != "fp32" and not train.half_params:
        # With fp32 parameters as the masters (autocast), the masters are the parameters
        # themselves: whole on every owner, where the cost model charges them sharded.
        raise SpecError(
            f"optimizer: a sharded {train.precision} plan needs its fp32 master weights in the "
            "optimizer (train.master_weights 'optimizer': half-precision parameters); with "
            "fp32 parameters as the masters they would stay whole on every owner",
            field="sharding",
        )
    _check_half_params(plan)
    if fp64 and train.precision != "fp32" and not train.half_params:
        raise SpecError(
            f"--fp64 runs an fp32 plan, or one with master_weights 'optimizer', in float64; "
            f"this plan is {train.precision} with fp32 parameters",
            field="train.precision",
        )


def _check_half_params(plan: Plan) -> None:
    """Half-precision parameters with fp32 masters in the optimizer run in pipelines without
    tensor parallelism (FSDP keeps fp32 sharded parameters; DTensor shards are not built)."""
    if not plan.train.half_params:
        return
    if plan.sharding == "full" or any(pipe.has_tp for pipe in plan.pipelines):
        what = "sharding 'full'" if plan.sharding == "full" else "tensor-parallel stages"
        raise SpecError(
            f"master_weights 'optimizer' (half-precision parameters) is not built for {what}; "
            "use master_weights 'params'",
            field="train.master_weights",
        )


def _check_schedule(plan: Plan, p: int) -> None:
    pipe = plan.pipelines[p]
    spec = pipe.schedule_in(plan.train)
    field = f"pipelines[{p}].schedule" if pipe.schedule else "train.schedule"
    if not spec.executable:
        runs = ", ".join(name for name, s in SCHEDULES.items() if s.executable)
        raise SpecError(
            f"{spec.name}: the runtime does not execute this schedule yet (it runs {runs})",
            field=field,
        )


def _check_tp(plan: Plan) -> None:
    """TP stages the runtime runs: degrees that are powers of two (gradient pieces over owners
    of different degrees must nest, `gradsync`, and so must the lanes of a pipeline whose degree
    changes, `runtime/lanes.py`), unsharded, one stage per device (the plan check refuses TP
    under multi-chunk schedules)."""
    if plan.sharding != "none" and any(pipe.has_tp for pipe in plan.pipelines):
        raise SpecError(
            f"sharding {plan.sharding!r} with tensor-parallel stages: the runtime does not shard "
            "TP (DTensor) parameters yet; use sharding 'none'",
            field="sharding",
        )
    for p, pipe in enumerate(plan.pipelines):
        for s, st in enumerate(pipe.stages):
            if st.tp & (st.tp - 1):
                raise SpecError(
                    f"a TP degree of {st.tp}: the runtime runs powers of two",
                    field=f"pipelines[{p}].stages[{s}].devices",
                )


def describe(plan: Plan, precision: str) -> list[str]:
    """What the runtime executes of `plan`, as rank 0 prints it before the first step;
    `precision` says how the plan's precision runs (`Precision.describe`)."""
    lines = [
        f"hetpp train: {plan.model.name}, {plan.num_devices} ranks, schedule {plan.schedule}",
        f"  precision {precision}",
    ]
    if plan.sharding == "full":
        lines.append(
            f"  sharding full: FSDP2 over all {plan.num_devices} ranks, per-rank batch shares"
        )
    if plan.optimizer_shards > 1:
        lines.append(
            f"  optimizer sharding: each gradient bucket's optimizer state split over its "
            f"{plan.optimizer_shards} owners (reduce-scatter, step, all-gather)"
        )
    for p, pipe in enumerate(plan.pipelines):
        spans = ", ".join(f"[{a}, {b})" for a, b in (st.layers for st in pipe.stages))
        devices = [st.devices if st.tp > 1 else st.device for st in pipe.stages]  # TP: groups
        again = [s for s, st in enumerate(pipe.stages) if st.recomputes(plan.train)]
        own = pipe.schedule_in(plan.train).name
        lines.append(
            f"  pipeline {p}: devices {devices}, layers {spans}, batch {pipe.batch} "
            f"({pipe.num_micro_batches} x {pipe.micro_batch_size}), recompute "
            + (f"stages {again}" if again else "off")
            + (f", schedule {own}" if own != plan.schedule else "")
        )
    return lines


def announce(
    plan: Plan,
    emulate: bool,
    devices: Sequence[int],
    precision: str,
    start: int,
    resumed_from: Path | None,
) -> None:
    """Rank 0's opening lines: what it executes (`describe`), where it resumes, and the emulated
    slowdown of each of `devices`."""
    print("\n".join(describe(plan, precision)), flush=True)
    if resumed_from is not None:
        print(f"resumed from {resumed_from} at step {start}", flush=True)
    if emulate and plan.cluster is not None:
        factors = ", ".join(f"{d}: x{emulate_slowdown(plan.cluster, d):g}" for d in devices)
        print(f"emulating device slowdowns {factors}", flush=True)
