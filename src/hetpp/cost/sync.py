"""Block-wise gradient sync after backward, and when each rank is done with the step.

With optimizer sharding (ZeRO-1) a bucket's all-reduce becomes a reduce-scatter (overlapped with
backward as the all-reduce was), and an all-gather of the updated parameters follows each
owner's (smaller) optimizer step (`finish_step`). No rank steps its optimizer before every rank's
sync is done: the gradient norm is one all-reduce over all of them (the runtime's).

One timing rule, asked at two levels: `hetpp.cost.step` runs it over a plan's devices, the
planner's `layout_tail` over (template, stage) groups of a layout it has not placed yet. Owners
are any hashable keys; finish times are any common clock (the planner counts back from the
pipelines' end, so its times are negative)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from hetpp.specs.trainspec import TrainSpec

K = TypeVar("K", bound=Hashable)


def run_buckets(
    buckets: Sequence[tuple[Sequence[K], float]],
    done: Mapping[K, float],
    ready_s: Sequence[float] | None = None,
) -> tuple[list[tuple[float, float, float]], dict[K, float]]:
    """Time all-reduces in the order given. Each `(owners, seconds)` is ready when its
    gradients are final: `ready_s[i]` where given (a bucket of one model chunk, once that
    chunk's stages have run their last backward), else once all its owners have finished
    backward (`done`). It starts once its owners are also free of the earlier ones (one
    collective at a time per owner, the same order everywhere: no deadlock).

    Returns each bucket's (ready, start, end) and when every owner is free after the last (its
    `done` if it has no bucket)."""
    busy: dict[K, float] = {}
    out = []
    for i, (owners, seconds) in enumerate(buckets):
        # lists, not generators: this runs for every bucket of every layout the search ranks
        ready = max([done[o] for o in owners]) if ready_s is None else ready_s[i]
        start = max([ready, *[busy.get(o, ready) for o in owners]])
        end = start + seconds
        for o in owners:
            busy[o] = end
        out.append((ready, start, end))
    return out, {k: max(t, busy.get(k, t)) for k, t in done.items()}


def optimizer_step_s(state_bytes: float, mem_bw_bytes_per_s: float) -> float:
    """The optimizer reads and writes every state byte once: memory-bound."""
    return 2 * state_bytes / mem_bw_bytes_per_s


def state_bytes(num_params: float, train: TrainSpec) -> float:
    """Weights, gradients and optimizer state of `num_params` parameters."""
    return num_params * train.state_bytes_per_param


def finish_step(
    free: Mapping[K, float],
    pipeline_end: Mapping[K, float],
    optimizer_s: Mapping[K, float],
    gathers: Sequence[tuple[Sequence[K], float]] = (),
    *,
    norm_s: float,
) -> tuple[list[tuple[float, float, float]], dict[K, float]]:
    """After the sync: the gradient norm (measured every step, for clipping and as a metric:
    `runtime.gradsync.GradSync.clip`) is one all-reduce over every rank (`norm_s`), which starts
    once the last rank's pipeline has ended and its buckets are done; only then does any rank
    step its optimizer. With optimizer sharding the owners of each bucket then all-gather its
    updated parameters (`gathers`, `(owners, seconds)` in their order, timed as `run_buckets`),
    here all on the critical path: an upper bound of `overlapped_step_s`, which `step_cost`
    prices (the planner's `layout_tail` keeps this cheaper bound). Returns the gathers'
    (ready, start, end) and when each rank is done."""
    norm_end = norm_end_s(free, pipeline_end, norm_s)
    return run_buckets(gathers, {k: norm_end + optimizer_s[k] for k in free})


def norm_end_s(free: Mapping[K, float], pipeline_end: Mapping[K, float], norm_s: float) -> float:
    """When the gradient norm's all-reduce over every rank ends (`finish_step`)."""
    return max([max(free[k], pipeline_end[k]) for k in free]) + norm_s


def step_end_s(
    free: Mapping[K, float],
    pipeline_end: Mapping[K, float],
    optimizer_s: Mapping[K, float],
    gathers: Sequence[tuple[Sequence[K], float]] = (),
    *,
    norm_s: float,
) -> float:
    """When the step ends: the last rank done with its optimizer step (and, sharded, its
    all-gathers; `finish_step`)."""
    return max(finish_step(free, pipeline_end, optimizer_s, gathers, norm_s=norm_s)[1].values())


def overlapped_step_s(
    norm_end: float,
    optimizer_s: Mapping[K, float],
    gathers: Sequence[tuple[Sequence[K], float]],
    first_forwards: Sequence[tuple[K, float, Sequence[int]]],
) -> tuple[float, list[tuple[float, float, float]]]:
    """The step of a sharded plan whose all-gathers overlap the next step's forward, as the
    runtime's `ShardedStep.gather` runs them: timed as the period from one gradient norm
    barrier to the next. Right after the barrier each rank steps its optimizer and the owners
    all-gather their buckets (`gathers`, timed as `run_buckets` from the barrier, in the order
    the next forward needs them); a stage's first forward, `(device, its start in a pipeline
    that waits for nothing, the gathers it needs)` in `first_forwards`, waits for its device's
    optimizer step and for those gathers (its release). In a max-plus schedule delaying actions
    by their releases delays the end by at most the largest `release - unconstrained start`:
    so the step is `norm_end` (the unconstrained pipelines, sync and norm) plus that, an upper
    bound, exact when the binding stage is on the critical path (a first stage).

    Returns the step and the gathers' (ready, start, end) counted from the barrier."""
    times, _ = run_buckets(gathers, optimizer_s)
    delay = 0.0
    for device, start_s, needs in first_forwards:
        release = max([optimizer_s[device], *[times[i][2] for i in needs]])
        delay = max(delay, release - start_s)
    return norm_end + delay, times
