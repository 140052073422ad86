"""From chosen pipelines to a Plan: concrete costs, data balance, the full cost, the result."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from hetpp.cost.comm import p2p_link
from hetpp.cost.memory import most_micro_batches, stage_memory
from hetpp.cost.pipeline import fill_and_beat, stage_times
from hetpp.cost.step import StepCost, pipeline_costs, plan_fits, step_cost
from hetpp.planner.balance import PipelineGroup, allocate
from hetpp.planner.placement import place
from hetpp.planner.problem import Problem
from hetpp.planner.recompute import drop_unneeded_recompute
from hetpp.planner.shapes import UNBOUNDED, ShapeContext, TemplateCost
from hetpp.specs.plan import PipelinePlan, Plan, StagePlan


@dataclass(frozen=True)
class Pipe:
    """One concrete pipeline: a unit per stage (a device, or a TP group's lead device) and the
    layer cut points."""

    devices: tuple[int, ...]
    bounds: tuple[int, ...]


@dataclass
class PlanResult:
    """What a strategy returns: its best plan with the full cost, or why there is none."""

    strategy: str
    plan: Plan | None
    step: StepCost | None
    search_time_s: float = 0.0
    note: str = ""
    """Why the strategy found nothing, or what it could not do."""
    others: tuple[PlanResult, ...] = ()
    """Plans the strategy ranked below its own that it promises never to be slower than (hpp:
    the baselines' plans after their schedule pass): a pass over its result afterwards
    (`sharding.sharded_schedule_pass`) runs on these too, so the promise holds after it."""

    @property
    def feasible(self) -> bool:
        return self.plan is not None and self.step is not None

    @property
    def iteration_time_s(self) -> float:
        return self.step.iteration_time_s if self.step else float("inf")

    @property
    def throughput_samples_per_s(self) -> float:
        return self.step.throughput_samples_per_s if self.step else 0.0

    def final_plan(self) -> Plan | None:
        """The plan with grad blocks and the estimate (incl. search time) filled in."""
        if self.plan is None or self.step is None:
            return None
        return self.plan.with_derived(estimate=self.step.estimate(self.search_time_s))

    def entry(self) -> dict[str, Any]:
        """One row of `hetpp compare --json`."""
        plan = self.final_plan()
        return {
            "strategy": self.strategy,
            "feasible": self.feasible,
            "iteration_time_s": self.iteration_time_s if self.feasible else None,
            "throughput_samples_per_s": self.throughput_samples_per_s if self.feasible else None,
            "search_time_s": self.search_time_s,
            "note": self.note,
            "plan": plan.model_dump(mode="json", exclude_none=True) if plan else None,
        }


def pipe_signature(problem: Problem, pipe: Pipe) -> tuple:
    """What a concrete pipeline's closed-form time and memory depend on: its stages' GPU types
    (which fix their TP degree), the links between them and its cuts."""
    cl = problem.cluster
    keys = tuple(cl.gpu(d).name.lower() for d in pipe.devices)
    links = tuple(p2p_link(cl, a, b) for a, b in zip(pipe.devices, pipe.devices[1:]))
    return keys, links, pipe.bounds


def pipe_group(problem: Problem, recompute: bool, mbs: int, pipe: Pipe) -> PipelineGroup:
    """Closed-form time of a concrete pipeline (its real links) and its micro-batch bounds;
    memoized per problem by `pipe_signature` (a large plan repeats a few pipelines hundreds of
    times, and the search builds many plans of the same pipelines)."""
    key = (recompute, mbs, pipe_signature(problem, pipe))
    if key not in problem.pipe_groups:
        problem.pipe_groups[key] = _pipe_group(problem, recompute, mbs, pipe)
    return problem.pipe_groups[key]


def _pipe_group(problem: Problem, recompute: bool, mbs: int, pipe: Pipe) -> PipelineGroup:
    cm = problem.cost_model(recompute)
    cl = problem.cluster
    costs = [cm.layer_costs(cl.gpu(d), mbs, tp=problem.tp_of(d)) for d in pipe.devices]
    links = [p2p_link(cl, d, nxt) for d, nxt in zip(pipe.devices, pipe.devices[1:])]
    fwd, bwd, comm = stage_times(costs, pipe.bounds, links)
    fill, beat = fill_and_beat(fwd, bwd, comm, problem.schedule)
    spec = problem.schedule_spec
    hi = _micro_batch_cap(problem, recompute, mbs, pipe, costs)
    return PipelineGroup(fill, beat, spec.min_micro_batches(len(pipe.devices)), hi)


def _micro_batch_cap(problem, recompute, mbs, pipe: Pipe, costs) -> int:
    """Most micro-batches per step with which every stage of the pipeline fits its device
    (`UNBOUNDED` if the whole global batch does): in-flight activations and live receive
    buffers as the schedule's `in_flight` and `recv_buffer_counts` say."""
    cm, spec = problem.cost_model(recompute), problem.schedule_spec
    limit, num = problem.micro_batches(mbs), len(pipe.devices)
    cap = limit
    for s, (c, d, (a, b)) in enumerate(zip(costs, pipe.devices, itertools.pairwise(pipe.bounds))):

        def mem(m: int, s=s, c=c, a=a, b=b) -> float:
            k = spec.in_flight(s, num, m)
            return stage_memory(cm.model, cm.train, c, a, b, k, m, schedule=spec).total

        cap = min(cap, most_micro_batches(mem, problem.cluster.gpu(d).memory_bytes, limit))
    return UNBOUNDED if cap >= limit else cap


def build_plan(
    problem: Problem,
    recompute: bool,
    mbs: int,
    pipes: Sequence[Pipe],
    strategy: str,
    micro_batches: Sequence[int] | None = None,
) -> Plan | None:
    """A Plan of these pipelines; micro-batch counts from data balance unless given.
    None if the global batch cannot be split over them."""
    total = problem.micro_batches(mbs)
    if micro_batches is None:
        groups: dict[PipelineGroup, list[int]] = {}
        for i, p in enumerate(pipes):
            groups.setdefault(pipe_group(problem, recompute, mbs, p), []).append(i)
        kinds = [replace(k, count=len(v)) for k, v in groups.items()]
        got = allocate(kinds, total)
        if got is None:
            return None
        counts = [0] * len(pipes)
        for ms, idx in zip(got[1], groups.values()):
            for m, i in zip(ms, idx):
                counts[i] = m
        micro_batches = counts
    if sum(micro_batches) != total or any(m < 1 for m in micro_batches):
        return None
    pipelines = tuple(
        PipelinePlan(
            stages=tuple(
                StagePlan(devices=problem.group_of(d), layers=(a, b))
                for d, (a, b) in zip(p.devices, itertools.pairwise(p.bounds))
            ),
            micro_batch_size=mbs,
            num_micro_batches=m,
        )
        for p, m in zip(pipes, micro_batches)
    )
    return Plan(pipelines=pipelines, strategy=strategy, **problem.plan_fields(recompute))


def evaluate(problem: Problem, plan: Plan) -> StepCost:
    """The full cost of a plan (the ranking every strategy uses), on the plan's layer unit."""
    problem = problem.on_unit(plan.model.layer_unit)
    return step_cost(plan, problem.cost_model(plan.train.recompute, shards=1))


def evaluate_below(problem: Problem, plan: Plan, bound_s: float) -> StepCost | None:
    """`evaluate(plan)`, or None when the plan does not fit or provably cannot take less than
    `bound_s`. Memory first (`cost.step.plan_fits`): it needs no pipeline times, and most
    multi-chunk trials of the schedule pass that fail, fail there (lab-64: 67 of 83). Then a
    step ends no earlier than its slowest pipeline (every rank steps its optimizer after its
    pipeline ends), and the pipelines' times are the cheap part of the full cost (memoized per
    pipeline, `cost.step.pipeline_costs`)."""
    problem = problem.on_unit(plan.model.layer_unit)
    if plan.sharding != "full":
        cm = problem.cost_model(plan.train.recompute, shards=1)
        if not plan_fits(plan, cm):
            return None
        if bound_s < math.inf and max(k.time_s for k in pipeline_costs(plan, cm)) >= bound_s:
            return None
    return evaluate(problem, plan)


def unused_devices(problem: Problem, plan: Plan) -> list[int]:
    """Devices no pipeline uses (too small or too slow to help, or left over)."""
    used = {d for p in plan.pipelines for s in p.stages for d in s.devices}
    return [d.id for d in problem.cluster.devices if d.id not in used]


@dataclass
class Draft:
    """A plan in the making: pipelines on devices, with the search's estimate of its time."""

    estimate_s: float
    recompute: bool
    mbs: int
    pipes: list[Pipe]
    micro_batches: list[int] | None = None
    """Fixed counts (equal-batch baselines); None: data balance decides."""


def layout_pipes(problem: Problem, layout: Sequence[tuple[TemplateCost, int]]) -> list[Pipe] | None:
    """Place `count` copies of each template on devices; None if they do not fit the cluster."""
    templates = [t for t, n in layout for _ in range(n)]
    placed = place(problem, [t.runs for t in templates])
    if placed is None:
        return None
    return [Pipe(devices, t.bounds) for t, devices in zip(templates, placed)]


def best_candidate(
    problem: Problem,
    candidates: Sequence[Draft],
    strategy: str,
    top: int = 2,
    bound_s: float = math.inf,
) -> tuple[Plan, StepCost] | None:
    """Full cost of the `top` best-estimated candidates that form valid plans; the fastest.
    With `bound_s` (a time no plan the caller keeps reaches), plans that provably cannot beat
    it are not given the full cost (`evaluate_below`), nor returned."""
    best: tuple[Plan, StepCost] | None = None
    tried = 0
    for c in sorted(candidates, key=lambda c: c.estimate_s):
        if tried >= top:
            break
        plan = build_plan(problem, c.recompute, c.mbs, c.pipes, strategy, c.micro_batches)
        if plan is None:
            continue
        tried += 1
        plan = drop_unneeded_recompute(problem, plan)
        step = evaluate_below(problem, plan, bound_s)
        if step is None:
            continue
        if step.fits and (best is None or step.iteration_time_s < best[1].iteration_time_s):
            best = (plan, step)
    return best


def layout_key(layout: Sequence[tuple[TemplateCost, int]]) -> tuple:
    """Identity of a layout (templates and their counts, order-free)."""
    return tuple(sorted((t.runs, t.bounds, n) for t, n in layout))


class Incumbent:
    """The best plans so far, and the bound the best sets: new layouts are ranked by the full
    cost. It keeps the `keep` fastest (distinct) ones, and the fastest of each setting
    (recomputation, micro-batch size), for the schedule pass to try at the end
    (`hetpp.planner.schedules`: a runner-up with deeper pipelines or larger micro-batches, more
    bubble to remove, may gain more)."""

    def __init__(self, problem: Problem, strategy: str, keep: int = 1):
        self.problem = problem
        self.strategy = strategy
        self.keep = keep
        self.results: list[PlanResult] = []
        """The fastest results so far, fastest first."""
        self.per_setting: dict[tuple[bool, int], PlanResult] = {}
        """The fastest result of each (recomputation, micro-batch size)."""
        self._seen: set[tuple] = set()

    @property
    def result(self) -> PlanResult | None:
        return self.results[0] if self.results else None

    @property
    def bound(self) -> float:
        """Full cost of the best plan so far (inf before the first)."""
        return self.result.iteration_time_s if self.result else math.inf

    def offer_result(self, r: PlanResult) -> None:
        """Keep a finished result if it is among the fastest so far."""
        if not r.feasible:
            return
        key = (r.plan.train.recompute, r.plan.pipelines[0].micro_batch_size)
        held = self.per_setting.get(key)
        if held is None or r.iteration_time_s < held.iteration_time_s:
            self.per_setting[key] = r
        if any(r.iteration_time_s == x.iteration_time_s for x in self.results):
            return
        self.results = sorted([*self.results, r], key=lambda x: x.iteration_time_s)[: self.keep]

    def offer(
        self, ctx: ShapeContext, layouts: Sequence[Sequence[tuple[TemplateCost, int]]]
    ) -> None:
        """Place, balance and cost each layout (once); keep the fastest."""
        cands = []
        for layout in layouts:
            key = (ctx.recompute, ctx.mbs, layout_key(layout))
            if key in self._seen:
                continue
            self._seen.add(key)
            pipes = layout_pipes(self.problem, layout)
            if pipes is not None:
                cands.append(Draft(0.0, ctx.recompute, ctx.mbs, pipes))
        # a plan no faster than the slowest kept one would not be kept (`offer_result`)
        full = len(self.results) >= self.keep
        bound = self.results[-1].iteration_time_s if full else math.inf
        got = best_candidate(self.problem, cands, self.strategy, len(cands), bound)
        if got:
            self.offer_result(PlanResult(self.strategy, got[0], got[1]))
