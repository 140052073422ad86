"""What the schedule pass tried on a benchmark row's final plan, and why each trial lost.

    .venv/bin/python bench/schedule_trials.py --only CLUSTER:MODEL [...]

Plans the row as `bench/planner.py` does (hpp, its default sharding), then replays the schedule
pass (`planner.schedules.group_trials`, and every shape at once) on hpp's final plan, with the
problem it was costed with (sharded plans: `sharded_problem`) and the split freedom of the
strategy that made it. Per trial: not built (and why), overfilled (the worst device, its
memory over capacity, and what grew against the plan: model states, activations, receive
buffers, transients; the step it would take if it fitted; and the memory the overfilled
pipelines need against what their devices hold, which no re-split can bring below the sum of
what every stage holds whatever its cut where each stage holds the same micro-batches, as under
zbh1), or fit: its step against the plan's, split into the slowest pipeline's
work (micro-batches x busiest device), its bubble (the rest of that pipeline's time), P2P per
micro-batch on it, and the tail after the pipelines (exposed sync, optimizer, gathers). A plan
cut at half blocks (hpp's last pass) is replayed on the half-unit problem it was costed on.
"""

from __future__ import annotations

import argparse
import math
import sys

from planner import _chosen, scenarios

from hetpp.cost.step import StepCost, device_memories
from hetpp.planner import Problem, plan
from hetpp.planner.assemble import evaluate
from hetpp.planner.baselines import SCHEDULE_FREEDOM
from hetpp.planner.schedules import (
    CHUNK_COUNTS,
    _all_chunked,
    _costed,
    busiest_work_s,
    group_trials,
    pass_start,
    shape_groups,
)
from hetpp.planner.sharding import sharded_problem, sharded_start
from hetpp.specs import TrainSpec, load_cluster, load_model
from hetpp.specs.plan import Plan
from hetpp.specs.schedule import SCHEDULES

GB = 1e9


def _parts(plan: Plan, step: StepCost) -> dict[str, float]:
    """The slowest pipeline's work and bubble, its P2P per micro-batch, the tail (seconds)."""
    times = step.pipeline_time_s
    p = max(range(len(times)), key=times.__getitem__)
    m = plan.pipelines[p].num_micro_batches
    work = m * busiest_work_s(step)[p]
    p2p = sum(s.send_s for s in step.stages if s.pipeline == p)
    return {"work": work, "bubble": times[p] - work, "p2p": p2p,
            "tail": step.iteration_time_s - times[p]}  # fmt: skip


def _memory_verdict(base: StepCost, step: StepCost) -> str:
    """The worst device of an overfilled trial and what grew on it against `base`."""
    now, was = device_memories(step.stages), device_memories(base.stages)
    overfull = [(m.total / cap, d) for d, (m, cap) in now.items() if m.total > cap]
    ratio, d = max(overfull)
    m, cap = now[d]
    old = was[d][0]
    gpu = next(s.gpu for s in step.stages if s.device == d)
    grew = {
        "states": (m.weights + m.grads + m.optimizer) - (old.weights + old.grads + old.optimizer),
        "activations": m.activations - old.activations,
        "recv": m.recv_buffers - old.recv_buffers,
        "transient": m.transient - old.transient,
    }
    parts = ", ".join(f"{k} {v / GB:+.2f}" for k, v in grew.items())
    # what the overfilled pipelines' devices hold against their capacity, all together
    over = {dev for _, dev in overfull}
    full = {st.pipeline for st in step.stages if st.device in over}
    held = {st.device for st in step.stages if st.pipeline in full}
    need = sum(now[x][0].total for x in held)
    have = sum(now[x][1] for x in held)
    return (
        f"overfills {len(overfull)} devices; worst {d} ({gpu}) {ratio:.3f}x of "
        f"{cap / GB:.1f} GB; against the plan (GB): {parts}; "
        f"{step.iteration_time_s:.3f} s if it fitted; its pipelines need "
        f"{need / GB:.0f} of {have / GB:.0f} GB"
    )


def _verdict(problem: Problem, final: Plan, base: StepCost, trial: Plan | None) -> str:
    if trial is None:
        return "not built (layers, micro-batch count or torch's rules)"
    trial, step = _costed(problem, trial, math.inf, final.train.recompute)
    rc = sum(st.recompute is True for p in trial.pipelines for st in p.stages if p.chunks > 1)
    if rc:
        print(f"      (recomputes {rc} chunked stages)")
    if step is None:  # `evaluate_below` refuses a plan that overfills before timing it
        step = evaluate(problem, trial)  # the full cost times it and judges its memory after
    if not step.fits:
        return _memory_verdict(base, step)
    a, b = _parts(final, base), _parts(trial, step)
    diff = ", ".join(f"{k} {b[k] - a[k]:+.3f}" for k in a)
    ratio = step.iteration_time_s / base.iteration_time_s
    word = "faster" if ratio < 1 else "slower"
    return f"fits, {step.iteration_time_s:.3f} s ({ratio:.3f}x, {word}); against the plan: {diff}"


def report(cluster_file, model: str, batch: int, seq: int) -> None:
    cluster = load_cluster(cluster_file)
    spec = load_model(model, seq)
    train = TrainSpec(global_batch=batch, seq_len=seq)
    problem = Problem(spec, cluster, train, sharding_mode="targeted")
    result = plan(problem, "hpp")
    final = result.plan
    origin = result.note.split(" plan")[0].removeprefix("the ") if result.note else "hpp"
    split = SCHEDULE_FREEDOM.get(origin, ("balanced", True))[0]
    print(f"## {cluster.name} {model}: from {origin} (split {split})")
    costing = sharded_problem(problem) if final.sharding != "none" else problem
    replay(costing.on_unit(final.model.layer_unit), final, split)
    if final.sharding == "none" and len(final.pipelines) > 1:
        replay(*sharded_start(problem, final), split)  # what the targeted pass starts from


def replay(problem: Problem, final: Plan, split: str) -> None:
    """Every trial of the pass on `final`, with its verdict."""
    cluster = problem.cluster
    base = evaluate(problem, final)
    print(f"### sharding {final.sharding}, recompute {final.train.recompute}: "
          f"{base.iteration_time_s:.3f} s, fits {base.fits}")  # fmt: skip
    parts = _parts(final, base)
    print("plan: " + ", ".join(f"{k} {v:.3f} s" for k, v in parts.items()))
    start = pass_start(final)
    groups = shape_groups(problem, start)
    names = problem.schedules_to_try(start.train.recompute)
    print(f"schedules tried: {', '.join(names) or 'none'}")
    for members in groups.values():
        pipe = final.pipelines[members[0]]
        kinds = "+".join(cluster.gpu(d).name for d in pipe.devices)
        print(f"- {len(members)} x [{kinds}] mbs {pipe.micro_batch_size} "
              f"m {pipe.num_micro_batches}, layers {[s.layers for s in pipe.stages]}")  # fmt: skip
        for name, chunks, flip, thin, trial in group_trials(problem, start, members, names, split):
            rev = (", reversed" if flip else "") + (", thinned" if thin else "")
            print(f"    {name}/{chunks}{rev}: {_verdict(problem, final, base, trial)}")
    if len(groups) > 1:
        for name in names:
            for chunks in CHUNK_COUNTS[SCHEDULES[name].placement]:
                trial = _all_chunked(problem, start, groups, SCHEDULES[name], chunks, split)
                print(f"- all shapes {name}/{chunks}: {_verdict(problem, final, base, trial)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", required=True, help="CLUSTER[:MODEL] as bench/planner.py")
    args = ap.parse_args(argv)
    for cluster_file, model, batch, seq in scenarios(False):
        if _chosen((cluster_file, model, batch, seq), args.only):
            report(cluster_file, model, batch, seq)
    return 0


if __name__ == "__main__":
    sys.exit(main())
