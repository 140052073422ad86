"""Replay a Plan on the cost model: build every rank's program, run the engine, summarise.

Per-micro-batch costs (stage forward/backward, link times, bucket sizes, optimizer time) come from
the cost model, the same numbers `step_cost` uses; what the simulator decides on its own is *when*
everything happens. So where the two disagree, the closed-form timing is what is off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hetpp.cost.compute import CostModel
from hetpp.cost.memory import device_memory, stage_memory
from hetpp.cost.pipeline import weight_grad_s
from hetpp.cost.step import (
    StageCost,
    device_optimizer_time_s,
    gathers,
    norm_allreduce_s,
    stage_costs,
    stage_layer_costs,
    sync_buckets,
)
from hetpp.sim.engine import Collective, RankProgram, StageWork, run
from hetpp.sim.result import DeviceStats, SimResult, step_times
from hetpp.sim.schedule import rank_actions
from hetpp.sim.trace import COMPUTE, Kind, Trace
from hetpp.specs.errors import SpecError
from hetpp.specs.limits import MAX_SIM_ACTIONS, check_size
from hetpp.specs.plan import Plan
from hetpp.specs.schedule import SCHEDULES


def pipeline_programs(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    comm_s: Sequence[float],
    num_micro_batches: int,
    schedule: str = "1f1b",
    first_rank: int = 0,
    num_devices: int | None = None,
    weight_s: Sequence[float] | None = None,
    buckets: Sequence[Sequence[tuple[int, int | None]]] = (),
    opt_s: Sequence[float] = (),
    names: Sequence[str] = (),
    gathers: Sequence[Sequence[int]] = (),
    released: Sequence[Mapping[int, Sequence[int]]] | None = None,
) -> list[RankProgram]:
    """Programs of one pipeline from per-stage times (no plan or cost model needed).

    `comm_s[s]` is the link time between stage s and s+1, both directions (length S-1; 0 where
    both run on one device). The S stages run on `num_devices` ranks (default S), placed as the
    schedule says; `weight_s[s]` is the W part of stage s's backward (default `weight_grad_s`).
    Ranks are numbered from `first_rank`, so several pipelines can run in one engine;
    `buckets[d]` are the collectives device d joins, as (collective, the stage whose last
    backward makes it final on d; None: after all its compute), `opt_s[d]` its optimizer step
    (none when not given) and `gathers[d]` the all-gathers it joins after it (optimizer
    sharding); with `released[d]` (stage -> the all-gathers its forwards read) its program
    starts at the barrier instead (`sim.schedule.rank_actions`)."""
    num = len(fwd_s)
    d_count = num_devices or num
    spec = SCHEDULES[schedule]
    weight = weight_s if weight_s is not None else [weight_grad_s(b) for b in bwd_s]
    rank_of = [first_rank + spec.device_index(s, d_count) for s in range(num)]
    works: list[dict[int, StageWork]] = [{} for _ in range(d_count)]
    for s in range(num):
        works[rank_of[s] - first_rank][s] = StageWork(
            fwd_s=fwd_s[s],
            bwd_s=bwd_s[s],
            weight_s=weight[s],
            prev=rank_of[s - 1] if s > 0 else None,
            next=rank_of[s + 1] if s < num - 1 else None,
            send_next_s=comm_s[s] if s < num - 1 else 0.0,
            send_prev_s=comm_s[s - 1] if s > 0 else 0.0,
        )
    chunks = num // d_count
    default = [f"stage {d}" if first_rank == 0 else f"rank {first_rank + d}" for d in range(num)]
    return [
        RankProgram(
            actions=tuple(
                rank_actions(
                    schedule,
                    d,
                    d_count,
                    num_micro_batches,
                    chunks,
                    buckets[d] if buckets else (),
                    optimizer=bool(opt_s),
                    gathers=gathers[d] if gathers else (),
                    released=released[d] if released is not None else None,
                )
            ),
            stages=works[d],
            opt_s=opt_s[d] if opt_s else 0.0,
            name=(names or default)[d],
        )
        for d in range(d_count)
    ]


def simulate_pipeline(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    comm_s: Sequence[float],
    num_micro_batches: int,
    schedule: str = "1f1b",
    num_devices: int | None = None,
    weight_s: Sequence[float] | None = None,
) -> Trace:
    """Run one pipeline alone (no gradient sync, no optimizer)."""
    return run(
        pipeline_programs(
            fwd_s, bwd_s, comm_s, num_micro_batches, schedule,
            num_devices=num_devices, weight_s=weight_s,
        )
    )  # fmt: skip


def plan_programs(
    plan: Plan, cm: CostModel, stages: list[StageCost] | None = None
) -> tuple[list[RankProgram], list[Collective]]:
    """Every rank's program (pipeline by pipeline, device by device) and its collectives: the
    gradient all-reduces (sharded: reduce-scatters), then the sharded buckets' all-gathers, then
    the gradient norm's all-reduce over every rank."""
    if stages is None:
        stages, _ = stage_costs(plan, cm)
    rank_of = {}
    for st in stages:
        rank_of.setdefault(st.device, len(rank_of))
    collectives = []
    mine: dict[int, list[tuple[int, int | None]]] = {r: [] for r in range(len(rank_of))}
    after: dict[int, list[int]] = {r: [] for r in range(len(rank_of))}
    # Buckets as step_cost forms them (grad_buckets order: latest layers first, tied one last),
    # with its durations; every owner joins them in that one order, each once the bucket's
    # stage on it (a bucket per model chunk) has run its last backward.
    order = [
        (b.owners, b.end_s - b.start_s, b.stages or (None,) * len(b.owners))
        for b in sync_buckets(plan, cm, stages)
    ]
    gathered = gathers(plan, cm)
    first_gather = len(order)
    order += [(owners, seconds, None) for owners, _, _, seconds, _ in gathered]
    # Last, the gradient norm's all-reduce over every rank, after its buckets (`finish_step`):
    # a SYNC after all its compute, which its optimizer step waits for.
    if len(rank_of) > 1:
        every = tuple(sorted(rank_of))
        order.append((every, norm_allreduce_s(cm, every), (None,) * len(every)))
    for c, (owners, seconds, own) in enumerate(order):
        members = tuple(rank_of[d] for d in owners)
        collectives.append(Collective(members, seconds, own is None))
        for i, r in enumerate(members):
            if own is None:
                after[r].append(c)
            else:
                mine[r].append((c, own[i]))
    programs: list[RankProgram] = []
    for p, pipe in enumerate(plan.pipelines):
        own = [st for st in stages if st.pipeline == p]
        devices = pipe.devices
        # Sharded: each stage's first forward waits for the all-gathers of its buckets, the
        # step counted from the barrier (`cost.sync.overlapped_step_s`).
        released = None
        if gathered:
            released = [{st.stage: [] for st in own if st.device == d} for d in devices]
            index = {d: i for i, d in enumerate(devices)}
            for i, (owners, *_, by_stage) in enumerate(gathered):
                released[index[owners[p]]][by_stage[p]].append(first_gather + i)
        programs += pipeline_programs(
            [st.fwd_s for st in own],
            [st.bwd_s for st in own],
            [st.send_s for st in own[:-1]],
            pipe.num_micro_batches,
            pipe.schedule_in(cm.train).name,
            first_rank=rank_of[devices[0]],
            num_devices=len(devices),
            weight_s=[st.weight_s for st in own],
            buckets=[mine[rank_of[d]] for d in devices],
            gathers=[after[rank_of[d]] for d in devices],
            released=released,
            opt_s=[
                device_optimizer_time_s(
                    cm, [x for x in own if x.device == d], plan.optimizer_shards
                )
                for d in devices
            ],
            names=[f"device {d}" for d in devices],
        )
    return programs, collectives


def simulate_plan(plan: Plan, cm: CostModel) -> SimResult:
    """Simulate one training step of `plan` event by event."""
    if plan.sharding == "full":
        raise SpecError(
            "the simulator replays pipelines with block-wise gradient sync; sharding 'full' is "
            "costed by `hetpp estimate` only (FSDP)",
            field="sharding",
        )
    actions = sum(2 * len(p.stages) * p.num_micro_batches for p in plan.pipelines)
    check_size("forward and backward actions", actions, MAX_SIM_ACTIONS, field="pipelines")
    stages, _ = stage_costs(plan, cm)
    programs, collectives = plan_programs(plan, cm, stages)
    trace = run(programs, collectives)
    first_of: dict[int, StageCost] = {}  # each device's first stage, in rank order
    for st in stages:
        first_of.setdefault(st.device, st)
    firsts = list(first_of.values())
    iteration, pipes, exposed, bubble = step_times(
        trace, [st.pipeline for st in firsts], len(plan.pipelines)
    )
    compute = trace.time_per_rank((*COMPUTE, Kind.OPT))
    sync = trace.time_per_rank((Kind.SYNC, Kind.GATHER))
    in_flight = trace.max_in_flight()
    peak_act = _activation_peaks(plan, cm, stages, firsts, trace)
    devices = []
    for r, st in enumerate(firsts):
        mem = device_memory([x.memory for x in stages if x.device == st.device])
        static = mem.weights + mem.grads + mem.optimizer + mem.recv_buffers + mem.reserve
        devices.append(
            DeviceStats(
                device=st.device,
                gpu=st.gpu,
                pipeline=st.pipeline,
                stage=st.stage,
                layers=st.layers,
                compute_s=float(compute[r]),
                sync_s=float(sync[r]),
                iteration_s=iteration,
                max_in_flight=int(in_flight[r]),
                peak_memory_bytes=static + float(peak_act[r]),
                memory_capacity_bytes=st.capacity_bytes,
            )
        )
    return SimResult(
        schedule=cm.train.schedule,
        global_batch=plan.global_batch,
        iteration_time_s=iteration,
        pipeline_time_s=pipes,
        exposed_sync_s=exposed,
        bubble_fraction=bubble,
        devices=tuple(devices),
        trace=trace,
    )


def _activation_peaks(
    plan: Plan, cm: CostModel, stages: list[StageCost], firsts: list[StageCost], trace: Trace
) -> np.ndarray:
    """Per rank: peak of what the micro-batches hold in the replay (the cost model's
    `activations` of one in flight per stage, and of one between its I and its W, and the
    rank's largest `transient` during each backward; a rank running several stages keeps each
    stage's bytes apart)."""
    rank = {st.device: r for r, st in enumerate(firsts)}
    width = max(st.stage for st in stages) + 1
    saved = np.zeros((len(firsts), width))
    pending = np.zeros((len(firsts), width))
    transient = np.zeros(len(firsts))
    for st in stages:
        r = rank[st.device]
        pipe = plan.pipelines[st.pipeline]
        costs = stage_layer_costs(cm, pipe.stages[st.stage], pipe.micro_batch_size)
        one = stage_memory(cm.model, cm.train, costs, *st.layers, 1, 0)
        saved[r, st.stage] = one.activations
        schedule = pipe.schedule_in(plan.train)  # a V's turn keeps more
        place = (st.stage, len(pipe.stages), len(pipe.devices))
        pending[r, st.stage] = stage_memory(
            cm.model, cm.train, costs, *st.layers, 0, 0, 1, schedule, place, num_pending=1
        ).activations
        transient[r] = max(transient[r], one.transient)
    return trace.activation_peak(saved, transient, pending)
