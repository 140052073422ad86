"""Multi-chunk pipelines split again from whole-block counts, under the plan's own cost.

The schedule pass cuts a multi-chunk pipeline (interleaved, V) from the work each device had in
its one-chunk shape (`schedules._kept_counts_bounds`, `proportional_cuts`), and `resplit.climb`
then moves single cuts. A better split can lie out of the climb's reach: on lab-64 llama2-7b
each device's block count balanced against its speed, with the embedding and head counted on
the devices that hold them, runs 3% faster, but every single-layer move on the way makes a
neighbour the busiest stage.

`chunksplit_if_faster` tries, for each multi-chunk pipeline shape (identical pipelines
together, slowest first), the whole-block counts its devices' speeds deserve (`block_counts`)
dealt over each device's chunks in a few ways (`deal`), and keeps a candidate only where the
full step cost (`assemble.evaluate_below`, as the climb) is lower and the plan fits.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hetpp.cost.step import StepCost, overfilled_devices
from hetpp.planner.problem import Problem
from hetpp.planner.resplit import _built, _faster, _may_beat, _recut, _shape
from hetpp.specs.plan import PipelinePlan, Plan

Deal = Literal["first", "last", "time"]
DEALS: tuple[Deal, ...] = ("time", "first", "last")
"""How a device's blocks go to its chunks (`deal`): block counts as even as they go with the odd
ones on the earlier (`first`) or later (`last`) chunks, or chunk times as even as they go with
the embedding and head counted (`time`). Tried in this order; equal cuts are costed once."""

CAP_ROUNDS = 3
"""Most times `_shape_split` caps the devices a candidate overfills and counts again: each round
costs a memory walk and up to three step costs (mixed-8 llama2-7b: the balanced counts overfill
an RTX 4090)."""


def block_counts(
    per_block_s: Sequence[float],
    extra_s: Sequence[float],
    least: Sequence[int],
    blocks: int,
    most: Sequence[int] | None = None,
) -> list[int] | None:
    """Whole blocks per device (`blocks` in all, device d at least `least[d]` and at most
    `most[d]`) that make the busiest device's work, `extra_s[d] + count * per_block_s[d]`, as
    small as it goes: each next block to the device that is then done first among those below
    their cap (ties: the earlier device). Greedy is optimal here, every device's time growing
    with its count. None when the caps cannot hold `blocks` between them or sit below `least`."""
    counts = list(least)
    most = [blocks] * len(counts) if most is None else most
    if sum(counts) > blocks or sum(most) < blocks or any(a > b for a, b in zip(counts, most)):
        return None
    for _ in range(blocks - sum(counts)):
        open_ = [d for d in range(len(counts)) if counts[d] < most[d]]
        d = min(open_, key=lambda d: extra_s[d] + (counts[d] + 1) * per_block_s[d])
        counts[d] += 1
    return counts


def deal(blocks: int, extra_s: Sequence[float], per_block_s: float, how: Deal) -> list[int]:
    """`blocks` blocks over one device's chunks (in pipeline order), chunk c already holding
    `extra_s[c]` seconds of embedding/head (0.0: none; a chunk with none needs a block, else it
    would be an empty stage): each next block to the chunk with the fewest blocks (`first`,
    `last`: ties to the earlier or later chunk) or the least time (`time`). The caller ensures
    `blocks` covers the chunks that need one."""
    counts = [0 if e > 0 else 1 for e in extra_s]
    chunks = range(len(counts))
    keys = {
        "first": lambda c: (counts[c], c),
        "last": lambda c: (counts[c], -c),
        "time": lambda c: (extra_s[c] + counts[c] * per_block_s, c),
    }
    for _ in range(blocks - sum(counts)):
        counts[min(chunks, key=keys[how])] += 1
    return counts


@dataclass(frozen=True)
class ChunkLayout:
    """Where a multi-chunk pipeline's chunks sit and what its devices' layers cost."""

    stages_of: tuple[tuple[int, ...], ...]
    """Per device (in `PipelinePlan.devices` order), its stages in pipeline order."""
    held_s: tuple[float, ...]
    """Per stage, the seconds of embedding/head it holds (the first and last stages)."""
    per_block_s: tuple[float, ...]
    """Per device, one block's forward + backward seconds at the pipeline's micro-batch size,
    with recomputation where one of the device's stages recomputes."""
    blocks: int
    """Blocks in the model (the layer list less embedding and head)."""

    @classmethod
    def of(cls, problem: Problem, plan: Plan, pipe: PipelinePlan) -> ChunkLayout:
        """`pipe`'s layout under its schedule's placement."""
        devices, num = pipe.devices, len(pipe.stages)
        at = [pipe.schedule_in(plan.train).device_index(s, len(devices)) for s in range(num)]
        stages_of = tuple(tuple(s for s in range(num) if at[s] == d) for d in range(len(devices)))
        work = []
        for dev, stages in zip(devices, stages_of):
            rc = any(pipe.stages[s].recomputes(plan.train) for s in stages)
            costs = problem.cost_model(rc).layer_costs(
                problem.cluster.gpu(dev), pipe.micro_batch_size
            )
            work.append(costs.fwd_s + costs.bwd_s)
        held = [0.0] * num
        held[0] += float(work[at[0]][0])
        held[-1] += float(work[at[-1]][-1])
        per_block = tuple(float(w[1]) for w in work)
        return cls(stages_of, tuple(held), per_block, problem.layer_list_len - 2)

    def counts(self, most: Sequence[int] | None = None) -> list[int] | None:
        """`block_counts` of this layout: a block for each stage that holds no embedding/head,
        at most `most[d]` on device d (None: no cap)."""
        extra = [sum(self.held_s[s] for s in stages) for stages in self.stages_of]
        least = [sum(self.held_s[s] == 0.0 for s in stages) for stages in self.stages_of]
        return block_counts(self.per_block_s, extra, least, self.blocks, most)

    def own_counts(self, pipe: PipelinePlan) -> list[int]:
        """Blocks per device in `pipe`."""
        size = [st.num_layers for st in pipe.stages]
        size[0] -= 1  # the embedding
        size[-1] -= 1  # the head
        return [sum(size[s] for s in stages) for stages in self.stages_of]

    def cuts(self, counts: Sequence[int], how: Deal) -> tuple[int, ...]:
        """Stage bounds over the layer list with `counts[d]` blocks on device d, `deal`t `how`."""
        per_stage = [0] * len(self.held_s)
        for d, stages in enumerate(self.stages_of):
            held = [self.held_s[s] for s in stages]
            for s, n in zip(stages, deal(counts[d], held, self.per_block_s[d], how)):
                per_stage[s] = n
        per_stage[0] += 1
        per_stage[-1] += 1
        return tuple(itertools.accumulate(per_stage, initial=0))


def chunksplit_if_faster(problem: Problem, plan: Plan, step: StepCost) -> tuple[Plan, StepCost]:
    """`plan` with each multi-chunk pipeline shape (identical pipelines together, slowest
    first) split again (`_shape_split`) where that fits and costs less; `plan` and `step`
    where nothing does."""
    best = (plan, step)
    for members in _multi_chunk_shapes(problem, plan, step):
        best = _shape_split(problem, best, members)
    return best


def _shape_split(
    problem: Problem, best: tuple[Plan, StepCost], members: list[int]
) -> tuple[Plan, StepCost]:
    """`best` with the pipelines `members` (one shape) on the cheapest fitting of: their own
    block counts dealt each way of `DEALS`, then `ChunkLayout.counts` dealt so, counted again
    with a cap below each device the `time` deal overfills (at most `CAP_ROUNDS` times)."""
    pipe = best[0].pipelines[members[0]]
    layout = ChunkLayout.of(problem, best[0], pipe)
    tried = {(pipe.stages[0].layers[0], *(st.layers[1] for st in pipe.stages))}
    best, _ = _dealt_trials(problem, best, members, layout, layout.own_counts(pipe), tried)
    most = [layout.blocks] * len(layout.stages_of)
    counts = layout.counts()
    for _ in range(CAP_ROUNDS + 1):
        if counts is None:
            break
        best, over = _dealt_trials(problem, best, members, layout, counts, tried)
        if not over:
            break
        most = [n - 1 if dev in over else m for dev, n, m in zip(pipe.devices, counts, most)]
        counts = layout.counts(most)
    return best


def _dealt_trials(
    problem: Problem,
    best: tuple[Plan, StepCost],
    members: list[int],
    layout: ChunkLayout,
    counts: list[int],
    tried: set[tuple[int, ...]],
) -> tuple[tuple[Plan, StepCost], set[int]]:
    """`best` with `members` on `counts` dealt each way of `DEALS` where one fits and beats it
    (cuts in `tried` skipped, the rest added), and the devices the `time` deal overfills."""
    pipe = best[0].pipelines[members[0]]
    over: set[int] = set()
    for how in DEALS:
        cuts = layout.cuts(counts, how)
        if cuts in tried:
            continue
        tried.add(cuts)
        trial = _built(best[0], members, cuts)
        if _may_beat(problem, best, _recut(pipe, cuts)):
            best = _faster(problem, trial, best)
        elif how == "time":
            over = overfilled_devices(trial, problem.cost_model(trial.train.recompute, shards=1))
    return best, over


def _multi_chunk_shapes(problem: Problem, plan: Plan, step: StepCost) -> list[list[int]]:
    """The indices of each shape's pipelines (as `resplit.climb` groups them) among the
    multi-chunk ones without TP, the slowest shape first."""
    groups: dict[tuple, list[int]] = {}
    for i, pipe in enumerate(plan.pipelines):
        if pipe.chunks > 1 and not pipe.has_tp:
            key = (_shape(problem, plan, pipe), pipe.num_micro_batches)
            groups.setdefault(key, []).append(i)
    times = step.pipeline_time_s
    return sorted(groups.values(), key=lambda ids: -times[ids[0]])
