"""Replay a Plan on the cost model: build every rank's program, run the engine, summarise.

Per-micro-batch costs (stage forward/backward, link times, bucket sizes, optimizer time) come from
the cost model, the same numbers `step_cost` uses; what the simulator decides on its own is *when*
everything happens. So where the two disagree, the closed-form timing is what is off.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetpp.cost.comm import allreduce_time_s, group_link
from hetpp.cost.compute import CostModel
from hetpp.cost.step import (
    StageCost,
    optimizer_time_s,
    stage_costs,
    stage_layer_costs,
    sync_buckets,
)
from hetpp.sim.engine import Collective, RankProgram, run
from hetpp.sim.result import DeviceStats, SimResult, step_times
from hetpp.sim.schedule import stage_actions
from hetpp.sim.trace import Kind, Trace
from hetpp.specs.limits import MAX_SIM_ACTIONS, check_size
from hetpp.specs.plan import Plan


def pipeline_programs(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    comm_s: Sequence[float],
    num_micro_batches: int,
    schedule: str = "1f1b",
    first_rank: int = 0,
) -> list[RankProgram]:
    """Programs of one pipeline from per-stage times (no plan or cost model needed).

    `comm_s[s]` is the link time between stage s and s+1, both directions (length S-1). Ranks are
    numbered from `first_rank`, so several pipelines can run in one engine."""
    n = len(fwd_s)
    return [
        RankProgram(
            actions=tuple(stage_actions(schedule, s, n, num_micro_batches, optimizer=False)),
            fwd_s=fwd_s[s],
            bwd_s=bwd_s[s],
            prev=first_rank + s - 1 if s > 0 else None,
            next=first_rank + s + 1 if s < n - 1 else None,
            send_next_s=comm_s[s] if s < n - 1 else 0.0,
            send_prev_s=comm_s[s - 1] if s > 0 else 0.0,
            name=f"stage {s}" if first_rank == 0 else f"rank {first_rank + s}",
        )
        for s in range(n)
    ]


def simulate_pipeline(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    comm_s: Sequence[float],
    num_micro_batches: int,
    schedule: str = "1f1b",
) -> Trace:
    """Run one pipeline alone (no gradient sync, no optimizer)."""
    return run(pipeline_programs(fwd_s, bwd_s, comm_s, num_micro_batches, schedule))


def plan_programs(
    plan: Plan, cm: CostModel, stages: list[StageCost] | None = None
) -> tuple[list[RankProgram], list[Collective]]:
    """Every rank's program (pipeline by pipeline, stage by stage) and the gradient all-reduces."""
    if stages is None:
        stages, _ = stage_costs(plan, cm)
    rank_of = {s.device: r for r, s in enumerate(stages)}
    collectives = []
    mine: dict[int, list[int]] = {r: [] for r in range(len(stages))}
    # Buckets as step_cost forms them (grad_buckets order: latest layers first, tied one last);
    # every owner joins them in that one order.
    for c, bucket in enumerate(sync_buckets(plan, cm, stages)):
        members = tuple(rank_of[d] for d in bucket.owners)
        dur = allreduce_time_s(
            bucket.bytes, len(set(bucket.owners)), group_link(cm.cluster, bucket.owners)
        )
        collectives.append(Collective(members, dur))
        for r in members:
            mine[r].append(c)
    programs, r = [], 0
    for pipe in plan.pipelines:
        n = len(pipe.stages)
        for s in range(n):
            st = stages[r]
            actions = stage_actions(cm.train.schedule, s, n, pipe.num_micro_batches, mine[r])
            programs.append(
                RankProgram(
                    actions=tuple(actions),
                    fwd_s=st.fwd_s,
                    bwd_s=st.bwd_s,
                    prev=r - 1 if s > 0 else None,
                    next=r + 1 if s < n - 1 else None,
                    send_next_s=st.send_s,
                    send_prev_s=stages[r - 1].send_s if s > 0 else 0.0,
                    opt_s=optimizer_time_s(cm, st),
                    name=f"device {st.device}",
                )
            )
            r += 1
    return programs, collectives


def simulate_plan(plan: Plan, cm: CostModel) -> SimResult:
    """Simulate one training step of `plan` event by event."""
    actions = sum(2 * len(p.stages) * p.num_micro_batches for p in plan.pipelines)
    check_size("forward and backward actions", actions, MAX_SIM_ACTIONS, field="pipelines")
    stages, _ = stage_costs(plan, cm)
    programs, collectives = plan_programs(plan, cm, stages)
    trace = run(programs, collectives)
    pipeline_of = [s.pipeline for s in stages]
    iteration, pipes, exposed, bubble = step_times(trace, pipeline_of, len(plan.pipelines))
    compute = trace.time_per_rank((Kind.F, Kind.B, Kind.OPT))
    sync = trace.time_per_rank((Kind.SYNC,))
    in_flight = trace.max_in_flight()
    peak_act = _activation_peaks(plan, cm, stages, trace)
    devices = []
    for r, st in enumerate(stages):
        mem = st.memory
        static = mem.weights + mem.grads + mem.optimizer + mem.reserve
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
    plan: Plan, cm: CostModel, stages: list[StageCost], trace: Trace
) -> np.ndarray:
    """Per rank: peak of activations held in the replay, plus the send/receive buffers."""
    saved, transient, buffers = [], [], []
    for st in stages:
        mbs = plan.pipelines[st.pipeline].micro_batch_size
        costs = stage_layer_costs(cm, plan.pipelines[st.pipeline].stages[st.stage], mbs)
        a, b = st.layers
        saved.append(costs.saved(a, b))
        transient.append(float(costs.peak_extra_bytes[a:b].max(initial=0.0)))
        # one receive and one send buffer of the largest activation, as the cost model counts
        buffers.append(2 * float(costs.send_bytes[a:b].max(initial=0.0)))
    return trace.activation_peak(saved, transient) + buffers
