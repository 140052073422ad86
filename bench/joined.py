"""What joining a row's unused devices to its pipelines costs, trial by trial.

    .venv/bin/python bench/joined.py --only CLUSTER:MODEL [...]

Plans the row as `bench/planner.py` does (hpp, its default sharding) with the join switched
off (`planner.idle.joined_if_faster`, in the idle pass and the half-block pass), so the plan is
the one that leaves the devices unused; then, on that plan at its own unit and (a block-unit
plan) moved to half blocks with its cuts kept, every trial the join would build
(`idle._joined`: per pipeline shape, type with unused devices, micro-batch size dividing the
shape's share and k devices per pipeline; those the layers or the schedule's micro-batch rule
refuse are not printed), costed in full (`assemble.evaluate`): the step,
whether it fits and the device fullest against its capacity. The join itself stops at the first
k that fits per size; this prints them all. Last, the row with the join on.
"""

from __future__ import annotations

import itertools
import sys

from idle_devices import chosen_problems

from hetpp.cost.step import device_memories
from hetpp.planner import Problem, halves, idle, plan, unused_devices
from hetpp.planner.assemble import evaluate
from hetpp.planner.halves import in_halves
from hetpp.planner.sharding import sharded_problem

GB = 1e9


def _without_join(problem: Problem):
    """hpp's plan of `problem` with the join off in both passes that run it."""
    kept = idle.joined_if_faster
    off = lambda problem, plan, step: (plan, step)  # noqa: E731
    idle.joined_if_faster = halves.joined_if_faster = off
    try:
        return plan(problem, "hpp")
    finally:
        idle.joined_if_faster = halves.joined_if_faster = kept


def _trials(costed: Problem, got, free: set[int]) -> None:
    """Every join trial on `got` (costed on `costed`), one line each."""
    for members in idle._shapes(costed, got):
        pipe = got.pipelines[members[0]]
        share = pipe.micro_batch_size * pipe.num_micro_batches
        sizes = [b for b in costed.micro_batch_sizes if share % b == 0]
        for pool, mbs in itertools.product(costed.pools.values(), sizes):
            most = sum(d in free for node in pool.nodes for d in node) // len(members)
            for k in range(1, most + 1 if pool.tp == 1 else 1):
                trial = idle._joined(costed, got, members, pool.nodes, free, k, mbs)
                if trial is None:  # too few layers, or a count the schedule refuses
                    continue
                cost = evaluate(costed, trial)
                d, (m, cap) = max(device_memories(cost.stages).items(),
                                  key=lambda x: x[1][0].total / x[1][1])  # fmt: skip
                print(f"    {len(members)} x {pipe.schedule} + {k} {pool.gpu.name}, mbs {mbs}: "
                      f"step {cost.iteration_time_s:.4f} s, fits {cost.fits}, fullest device "
                      f"{d} ({costed.cluster.gpu(d).name}) {m.total / GB:.1f} of {cap / GB:.1f} "
                      f"GB")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    for model, problem in chosen_problems(argv, __doc__):
        cluster = problem.cluster
        got = _without_join(problem).plan
        free = set(unused_devices(problem, got))
        base = sharded_problem(problem) if got.sharding == "optimizer" else problem
        units = [got.model.layer_unit] + (["half"] if halves.can_halve(got) else [])
        for unit in units:
            moved = got if unit == got.model.layer_unit else in_halves(got)
            costed = base.on_unit(unit)
            step = evaluate(costed, moved).iteration_time_s
            print(f"{cluster.name} {model}, join off, {unit} units: step {step:.4f} s, "
                  f"{len(free)} devices unused")  # fmt: skip
            _trials(costed, moved, free)
        with_join = plan(problem, "hpp")
        print(f"  join on: step {with_join.iteration_time_s:.4f} s, "
              f"{len(unused_devices(problem, with_join.plan))} devices unused")  # fmt: skip
        sys.stdout.flush()


if __name__ == "__main__":
    main()
