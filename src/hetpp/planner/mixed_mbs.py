"""A micro-batch size per pipeline: a pass over hpp's final plan.

The search gives every pipeline of a plan one micro-batch size (an outer setting), so a size
that suits the fastest devices (8 samples on an H100) can leave slow ones idle: a T4 pipeline
running micro-batches of 8 finishes its first one after the H100s finish the step, so the
search leaves the T4s out. The plan format holds a size per pipeline (the cost model, the
simulator and the runtime take each pipeline's own), and this pass uses it:

1. devices the plan leaves unused take the pipelines that other settings' best plans (another
   micro-batch size, the same recomputation) placed on them, where those lie wholly on unused
   devices;
2. each pipeline shape (identical pipelines together, slowest first) tries the other sizes of
   `Problem.micro_batch_sizes`, its layer split kept (a multi-chunk one under each schedule of
   its placement: zbv at micro-batch 2 can overfill a V's turn where dualpipev fits).

Every trial shares the global batch out again in samples (`shares`) and is kept only where the
full step cost (`step_cost`, memory included) improves, so the pass never returns a slower
plan than it was given.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterator, Sequence

from hetpp.cost.step import StepCost
from hetpp.planner.assemble import evaluate_below, unused_devices
from hetpp.planner.balance import PipelineGroup
from hetpp.planner.problem import Problem
from hetpp.planner.schedules import _groups, _run_shape, _runs, _with_counts
from hetpp.planner.shapes import Workspace
from hetpp.specs.plan import PipelinePlan, Plan, StagePlan
from hetpp.specs.schedule import SCHEDULES


def mix_micro_batch_sizes(
    problem: Problem, ws: Workspace, plan: Plan, step: StepCost
) -> tuple[Plan, StepCost]:
    """`plan` with homogeneous pipelines added on its unused devices and a micro-batch size
    per pipeline shape, where that makes the step faster; its cost (`plan`'s own if nothing
    does). `ws` holds the search's shapes per setting."""
    if plan.sharding == "full":
        return plan, step
    best = (plan, step)
    starts = [plan] + [
        plan.with_pipelines([*plan.pipelines, *extra]) for extra in _on_unused(problem, ws, plan)
    ]
    for start in starts:
        got = _sizes_per_shape(problem, start, best[1].iteration_time_s)
        if got is not None:
            best = got
    return best


def _sizes_per_shape(problem: Problem, plan: Plan, bound_s: float) -> tuple[Plan, StepCost] | None:
    """`plan` (its batch shared out, `shares`), then each of its pipeline shapes (identical
    pipelines together, the largest micro-batches first) at each other micro-batch size (a
    multi-chunk shape also under the other schedules of its placement, `_placed_alike`),
    kept where the step gets faster: the fastest found, if faster than `bound_s`."""
    best = None

    def offer(trial: Plan | None) -> None:
        nonlocal best, bound_s
        cost = None if trial is None else evaluate_below(problem, trial, bound_s)
        if cost is not None and cost.fits and cost.iteration_time_s < bound_s:
            best, bound_s = (trial, cost), cost.iteration_time_s

    offer(shares(problem, plan))
    groups: dict[tuple, list[int]] = {}
    for i, pipe in enumerate(plan.pipelines):
        groups.setdefault(_shape(problem, pipe), []).append(i)
    for members in sorted(groups.values(), key=lambda g: -plan.pipelines[g[0]].micro_batch_size):
        start = plan if best is None else best[0]
        first = start.pipelines[members[0]]
        sizes = [s for s in problem.micro_batch_sizes if s != first.micro_batch_size]
        for size, schedule in itertools.product(sizes, _placed_alike(problem, start, first)):
            # each member at the least count from its own up that the schedule runs: `shares`
            # prices the pipelines at their counts before it deals new ones
            shape = (schedule or plan.train.schedule, len(first.stages), len(first.devices))
            counts = [_next_count(shape, start.pipelines[i].num_micro_batches - 1) for i in members]
            if None in counts:
                continue
            pipes = list(start.pipelines)
            for i, m in zip(members, counts):
                update = {"micro_batch_size": size, "schedule": schedule, "num_micro_batches": m}
                pipes[i] = pipes[i].model_copy(update=update)
            offer(shares(problem, start.with_pipelines(pipes)))
    return best


def _placed_alike(problem: Problem, plan: Plan, pipe: PipelinePlan) -> tuple[str | None, ...]:
    """`pipe`'s schedule, then (multi-chunk) the others the problem allows on its recomputation
    that place its stages on its devices as it does, so its cuts stay valid: another size can
    overfill under one and fit under the other (16 H100 + 16 A100-40GB, llama3-8b: zbv at
    micro-batch 2 overfills the A100 at a V's turn, dualpipev fits and is 2.3% faster)."""
    if pipe.chunks == 1:
        return (pipe.schedule,)
    own = pipe.schedule_in(plan.train)
    recompute = any(st.recomputes(plan.train) for st in pipe.stages)
    others = (
        n
        for n in problem.schedules_to_try(recompute)
        if n != own.name
        and SCHEDULES[n].placement == own.placement
        and SCHEDULES[n].allows_chunks(pipe.chunks)
    )
    return (pipe.schedule, *others)


def _on_unused(problem: Problem, ws: Workspace, plan: Plan) -> Iterator[list[PipelinePlan]]:
    """Pipelines on the devices `plan` leaves unused: per GPU type, as many copies as they
    make of its shallowest homogeneous shape that fits, and of one a device deeper, at each
    micro-batch size (micro-batch counts to be shared out)."""
    free = set(unused_devices(problem, plan))
    for key, pool in problem.pools.items():
        ids = [d for node in pool.nodes for d in node if d in free]
        if pool.tp > 1 or not ids:
            continue
        for size in problem.micro_batch_sizes:
            ctx = ws.context(plan.train.recompute, size)
            depths = range(1, min(len(ids), ctx.layer_list_len) + 1)
            first = next((d for d in depths if ctx.homogeneous(key, d) is not None), None)
            for depth in () if first is None else (first, first + 1):
                shape = ctx.homogeneous(key, depth) if depth <= len(ids) else None
                if shape is None:
                    continue
                layers = list(itertools.pairwise(shape.bounds))
                yield [
                    PipelinePlan(
                        stages=tuple(
                            StagePlan(devices=(d,), layers=span)
                            for d, span in zip(ids[c : c + depth], layers)
                        ),
                        micro_batch_size=size,
                        num_micro_batches=1,
                    )
                    for c in range(0, len(ids) - depth + 1, depth)
                ]


def shares(problem: Problem, plan: Plan) -> Plan | None:
    """`plan` with micro-batch counts whose samples (each pipeline's count times its own size)
    add up to the global batch, the slowest pipeline as early as greedy filling gets it
    (`hand_out`). None when the sizes cannot add up to the batch, or memory caps a pipeline's
    count (GPipe)."""
    lines = _groups(problem, plan)
    if lines is None:
        return None
    shapes = [_run_shape(plan, pipe) for pipe in plan.pipelines]
    sizes = [pipe.micro_batch_size for pipe in plan.pipelines]
    counts = hand_out(lines, shapes, sizes, plan.global_batch)
    return None if counts is None else _with_counts(problem, plan, counts)


def hand_out(
    lines: Sequence[PipelineGroup],
    shapes: Sequence[tuple[str, int, int]],
    sizes: Sequence[int],
    batch: int,
) -> list[int] | None:
    """Micro-batch counts per pipeline (`lines[i]`: its time per count, `shapes[i]`: what
    `_runs` reads, `sizes[i]`: its micro-batch size) whose samples add up to `batch`: every
    pipeline starts at the fewest micro-batches its schedule takes, then each next micro-batch
    goes to the pipeline that finishes it first (the lowest index on equal times) among those it
    still fits in; None if that does not reach `batch`.

    Identical pipelines (one line, shape and size) go together: they reach each count one
    after another, so a group takes a count at once where nothing else comes between them
    (the next entry's time and index), and one by one only where something does or the batch
    runs out. The same counts as handing out one micro-batch at a time (a test), without a
    heap operation per micro-batch (84k of them in 36 calls of one 1024-GPU search)."""
    kinds: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(lines, shapes, sizes)):
        kinds.setdefault(key, []).append(i)
    counts = [0] * len(lines)
    heap = []
    left = batch
    for (line, shape, size), members in kinds.items():
        m = _next_count(shape, line.lo - 1)
        if m is None:
            return None
        left -= size * m * len(members)
        _push(heap, line, shape, size, members, m, counts)
    while left > 0 and heap:
        t, _, n, m, members, line, shape, size = heapq.heappop(heap)
        more = size * (n - m)
        # The members that come before the next entry: all, unless it has the same time (a
        # count's time grows with the count, so a member's next count never comes between).
        cut = len(members)
        if heap and heap[0][0] == t:
            cut = bisect.bisect_left(members, heap[0][1])
        took = min(cut, left // more)
        left -= more * took
        _push(heap, line, shape, size, members[:took], n, counts)
        if took < cut:  # the batch ran out for this count: these and the rest take no more
            for i in members[took:]:
                counts[i] = m
        elif cut < len(members):  # the rest wait for the entry between them
            heapq.heappush(heap, (t, members[cut], n, m, members[cut:], line, shape, size))
    for _, _, _, m, members, *_ in heap:
        for i in members:
            counts[i] = m
    return counts if left == 0 else None


def _push(heap, line, shape, size, members, m, counts) -> None:
    """Members now at `m` micro-batches: their entry for the next count they run, or their
    count final where there is none."""
    if not members:
        return
    n = _next_count(shape, m)
    if n is None:
        for i in members:
            counts[i] = m
        return
    heapq.heappush(heap, (line.time(n), members[0], n, m, members, line, shape, size))


def _next_count(shape: tuple[str, int, int], m: int) -> int | None:
    """The least count above `m` a pipeline of `shape` runs (within one stage count of it)."""
    for n in range(m + 1, m + 1 + shape[1] + 1):
        if _runs(*shape, n):
            return n
    return None


def _shape(problem: Problem, pipe: PipelinePlan) -> tuple:
    """What pipelines of one shape share: stages' GPU types and layers, schedule, size."""
    return (
        tuple((problem.cluster.gpu(st.device).name, st.layers, st.tp) for st in pipe.stages),
        len(pipe.devices),
        pipe.schedule,
        pipe.micro_batch_size,
    )
