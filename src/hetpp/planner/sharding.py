"""Optimizer sharding (ZeRO-1 over block owners) as a planner choice: off, on, or where memory or
time says so (`Problem.sharding_mode`).

A strategy searches unchanged with `Problem.optimizer_shards` set: k > 1 sizes every stage as if
each bucket's optimizer state were split k ways, which lets a plan of k or more pipelines hold
what an unsharded one cannot. The plans it returns are costed with their own pipeline count
(`assemble.evaluate`), so one that relied on more owners than it has and does not fit is
dropped there. `auto` runs the unsharded search, costs its plan both ways (time), and where
memory may have shaped it (`_memory_short`) searches sharded too; every plan found is costed
both ways and the fastest that fits is kept. `targeted` (the default of `hetpp plan` and the
planner benchmark) runs the unsharded search once and then only the schedule pass again on its
plan sharded (`sharded_schedule_pass`): the multi-chunk trials that overfilled devices unsharded
are what sharding lets fit, at the cost of one pass instead of up to three more searches.

In mixed precision a sharded plan stores its parameters and gradients in the half type and the
fp32 masters in the optimizer (`TrainSpec.master_weights` "optimizer": 2 + 2 + 12/P B per
parameter), the only sharded mixed precision the runtime runs (with fp32 parameters as masters
they would stay whole on every owner). So sharded searches and costings use that TrainSpec
(`sharded_problem`); the unsharded plan of a sharded search keeps it too (2 + 2 + 12).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

from hetpp.cost.memory import devices_to_hold, model_state_bytes
from hetpp.planner.assemble import PlanResult, evaluate, unused_devices
from hetpp.planner.baselines import SCHEDULE_FREEDOM
from hetpp.planner.idle import with_idle_pipelines
from hetpp.planner.mixed_mbs import mix_micro_batch_sizes
from hetpp.planner.problem import Problem
from hetpp.planner.recompute import drop_unneeded_recompute
from hetpp.planner.resplit import resplit_if_faster
from hetpp.planner.schedules import choose_schedules
from hetpp.planner.shapes import Workspace
from hetpp.specs.plan import Plan

SHARD_GUESSES = (2, 4)
"""Owners per bucket the sharded searches size memory for, as multiples of the unsharded plan's
pipeline count (at most one per device)."""

TARGETED_MIN_GAIN = 0.01
"""The least share of the step `targeted` sharding must save: a sharded bf16 plan also changes
where the fp32 masters live, not worth it for a rounding-size gain."""

Search = Callable[[Problem, float | None], PlanResult]
"""One strategy run on a problem, with the time it may take (None: no limit)."""


def search_with_sharding(
    problem: Problem, search: Search, time_limit_s: float | None
) -> PlanResult:
    """The fastest plan over the sharding choices `problem.sharding_mode` allows. With a time
    limit, every search after the first gets what is left of it."""
    t0 = time.perf_counter()
    mode = problem.sharding_mode
    if mode == "none":
        return search(problem, time_limit_s)
    if mode == "targeted":
        base = search(problem, time_limit_s)
        limit = math.inf if time_limit_s is None else t0 + time_limit_s
        best = _targeted(problem, base, lambda: time.perf_counter() > limit)
        return replace(best, search_time_s=time.perf_counter() - t0)

    def left() -> float | None:
        return None if time_limit_s is None else max(0.0, time_limit_s - (time.perf_counter() - t0))

    sharded = sharded_problem(problem)
    base = search(replace(problem, optimizer_shards=1), time_limit_s)
    found = _both_ways(problem, sharded, base, keep_unsharded=mode == "auto")
    tried: list[int] = []
    if mode == "optimizer" or _memory_short(problem, base):
        pipes = len(base.plan.pipelines) if base.feasible else 1
        ks = {min(g * pipes, problem.cluster.num_devices) for g in SHARD_GUESSES}
        # Half-precision parameters hold less unsharded too (2 + 2 + 12 against 2 + 4 + 12).
        ks = (ks | {1}) if sharded is not problem and mode == "auto" else ks - {1}
        for k in sorted(ks):
            got = search(replace(sharded, optimizer_shards=k), left())
            found += _both_ways(sharded, sharded, got, keep_unsharded=mode == "auto")
            tried.append(k)
    best = min(found, key=lambda r: r.iteration_time_s, default=None)
    elapsed = time.perf_counter() - t0
    if best is None:
        return replace(base, search_time_s=elapsed, note=_none_sharded(base.note, sharded, tried))
    return replace(best, search_time_s=elapsed)


def _targeted(
    problem: Problem, result: PlanResult, out_of_time: Callable[[], bool] = lambda: False
) -> PlanResult:
    """`sharded_schedule_pass` on `result` and on each plan it promises never to be slower
    than (`PlanResult.others`): the fastest, as `result`'s strategy's plan. Without the others,
    a baseline sharded this way could beat hpp's plan sharded (lab-64 llama2-7b: 0.92x). Each
    pass only while `out_of_time()` is false (a time limit: the best plan so far, its note
    saying what was skipped)."""
    if out_of_time():
        return _skipped(result)
    got = sharded_schedule_pass(problem, result)
    for other in result.others:
        if out_of_time():
            return _skipped(got)
        alt = sharded_schedule_pass(problem, other)
        if alt.iteration_time_s < got.iteration_time_s:
            plan = alt.plan.model_copy(update={"strategy": result.plan.strategy})
            note = f"the {other.strategy} plan, sharded, was the best found"
            got = replace(result, plan=plan, step=alt.step, note=note)
    return _sharded_sizes(problem, got)


def _sharded_sizes(problem: Problem, result: PlanResult) -> PlanResult:
    """hpp's last passes, a micro-batch size per pipeline (`mixed_mbs.mix_micro_batch_sizes`)
    and GPipe pipelines on idle devices (`idle.with_idle_pipelines`), again on the sharded plan
    `_targeted` keeps: the memory sharding frees can hold larger micro-batches, where the
    unsharded passes judged by the unsharded plan's memory. The baselines keep one size per
    plan (their plan space). Once, on the plan kept (on every candidate it doubled the search
    on mega-1024), so a sharded plan that misses `TARGETED_MIN_GAIN` without it is not tried.
    Never slower: each pass keeps the plan unless a trial that fits beats it."""
    if result.strategy != "hpp" or not result.feasible or result.plan.sharding != "optimizer":
        return result
    sharded = sharded_problem(problem)
    plan, step = mix_micro_batch_sizes(sharded, Workspace(sharded), result.plan, result.step)
    plan, step = with_idle_pipelines(sharded, plan, step)
    return result if step is result.step else replace(result, plan=plan, step=step)


def _skipped(result: PlanResult) -> PlanResult:
    """`result` with its note saying the time limit cut the sharded passes short."""
    why = "time limit reached: sharded schedule passes skipped"
    return replace(result, note="; ".join(x for x in (result.note, why) if x))


def sharded_schedule_pass(problem: Problem, result: PlanResult) -> PlanResult:
    """`result` (the unsharded search's plan), or that plan sharded (ZeRO-1 over its block
    owners) with the schedule pass run again on it, where that is faster and fits: sharding
    frees each owner's optimizer state, which lets the multi-chunk trials that overfilled fit
    (their extra activations, a second layer on a device). The pass starts from the plan's
    one-chunk pipelines' layout; its cuts, counts and batch shares are the search's, and the
    strategy's own split and batch freedom (`SCHEDULE_FREEDOM`) apply. Never slower: the
    unsharded plan is kept unless a sharded one beats it."""
    if not result.feasible or result.plan.sharding != "none" or len(result.plan.pipelines) < 2:
        return result
    sharded, plan = sharded_start(problem, result.plan)
    split, rebalance = SCHEDULE_FREEDOM.get(result.strategy, ("balanced", True))
    plan, step = choose_schedules(sharded, plan, split, rebalance)
    # the one-chunk pipelines' cuts were made for unsharded memory: split them again for this
    plan, step = resplit_if_faster(sharded, plan, step, split, rebalance)
    if step.fits and step.iteration_time_s < (1 - TARGETED_MIN_GAIN) * result.iteration_time_s:
        return replace(result, plan=plan, step=step)
    return result


def sharded_start(problem: Problem, plan: Plan) -> tuple[Problem, Plan]:
    """The problem sharded plans are costed with and `plan` marked `optimizer` in its
    precision, recomputation dropped where a stage fits without it: where the targeted pass
    starts."""
    sharded = sharded_problem(problem)
    train = plan.train.model_copy(update={"master_weights": sharded.train.master_weights})
    start = plan.model_copy(update={"sharding": "optimizer", "train": train})
    return sharded, drop_unneeded_recompute(sharded, start)


def _none_sharded(note: str, sharded: Problem, tried: list[int]) -> str:
    """The unsharded search's reason for finding nothing, and which sharded searches (owners
    per bucket, bytes per parameter) found nothing either: the reason alone speaks of the
    unsharded state only."""
    if not tried:
        return note
    train = sharded.train
    fixed = f"{train.dtype_bytes} + {train.kept_grad_bytes_per_param}"
    ways = ", ".join(
        f"{k} owner{'s' * (k > 1)} per bucket ({fixed} + {train.optimizer_bytes_per_param / k:g}"
        " B per parameter)"
        for k in tried
    )
    return f"{note}; with the optimizer state over {ways} no plan fits either"


def sharded_problem(problem: Problem) -> Problem:
    """`problem` as sharded plans are made and costed: in mixed precision with half-precision
    parameters and the fp32 masters in the optimizer (the module docstring says why); one
    object per problem (`Problem.derived`)."""
    train = problem.train
    if train.precision == "fp32" or train.half_params:
        return problem
    got = problem.derived.get("sharded")
    if got is None:
        train = train.model_copy(update={"master_weights": "optimizer"})
        got = problem.derived["sharded"] = replace(problem, train=train)
    return got


def _both_ways(
    source: Problem, sharded: Problem, result: PlanResult, keep_unsharded: bool
) -> list[PlanResult]:
    """`result`'s plan (found for `source`) costed with and (`keep_unsharded`, or one pipeline:
    nothing to shard) without sharding, where it fits: unsharded in `source`'s precision,
    sharded in `sharded`'s."""
    if not result.feasible:
        return []
    if result.plan.sharding == "full":  # FSDP shards everything already
        return [result]
    out = []
    choices = ["none"] if keep_unsharded or len(result.plan.pipelines) == 1 else []
    if len(result.plan.pipelines) > 1:
        choices.append("optimizer")
    for sharding in choices:
        if sharding == result.plan.sharding:
            plan, step = result.plan, result.step
        else:  # sharded, a stage may fit without recomputation
            problem = source if sharding == "none" else sharded
            train = result.plan.train.model_copy(
                update={"master_weights": problem.train.master_weights}
            )
            plan = result.plan.model_copy(update={"sharding": sharding, "train": train})
            plan = drop_unneeded_recompute(problem, plan)
            step = evaluate(problem, plan)
        if step.fits:
            out.append(replace(result, plan=plan, step=step))
    return out


def _memory_short(problem: Problem, result: PlanResult) -> bool:
    """Whether memory may have shaped the unsharded plan: none fits, a stage recomputes,
    devices are left unused, or the model's state does not fit its largest device alone (so
    pipelines are at least as deep as memory makes them)."""
    if not result.feasible:
        return True
    plan = result.plan
    recomputes = any(st.recomputes(plan.train) for p in plan.pipelines for st in p.stages)
    cm = problem.cost_model(False, shards=1)
    largest = max(d.gpu.memory_bytes for d in problem.cluster.devices)
    deep = (devices_to_hold(model_state_bytes(cm.model, cm.train), largest, cm.train) or 2) > 1
    return recomputes or deep or bool(unused_devices(problem, plan))
