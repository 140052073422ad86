"""Why a benchmark row's plan leaves devices idle, and what the idle pass made of them.

    .venv/bin/python bench/idle_devices.py --only CLUSTER:MODEL [...]

Plans the row as `bench/planner.py` does (hpp, its default sharding) and, for hpp's final
plan, prints per GPU type with unused devices: how many, one sample's whole-model forward and
backward on one device of the type (what a GPipe pipeline of it needs at least for one
micro-batch) against the step's slowest pipeline, and the samples the pipelines that end last
must shed for the step to get shorter (`planner.idle`). Then the idle pass's trials
(`planner.idle._idle_trials`), the most samples first: the closed form, and either why it was
not costed (the rest of the batch cannot be shared out, or leaves the slowest pipeline no
earlier) or its full step against the plan's (exposed sync after the pipelines included).
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Iterator

from planner import _chosen, scenarios

from hetpp.planner import Problem, plan, unused_devices
from hetpp.planner.assemble import evaluate
from hetpp.planner.idle import IDLE_TRIALS, _idle_trials, _to_shed, _with_trial
from hetpp.planner.sharding import sharded_problem
from hetpp.specs import TrainSpec, load_cluster, load_model


def chosen_problems(argv: list[str] | None, doc: str) -> Iterator[tuple[str, Problem]]:
    """(model, problem) of each suite row the command line's `--only` names, the problem as
    `bench/planner.py` plans it (hpp's default sharding); `doc` is the script's docstring."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--only", nargs="+", required=True, metavar="CLUSTER:MODEL")
    args = ap.parse_args(argv)
    for cluster_file, model, batch, seq in scenarios(False):
        if _chosen((cluster_file, model), args.only):
            train = TrainSpec(global_batch=batch, seq_len=seq)
            cluster = load_cluster(cluster_file)
            yield model, Problem(load_model(model, seq), cluster, train, sharding_mode="targeted")


def main(argv: list[str] | None = None) -> None:
    for model, problem in chosen_problems(argv, __doc__):
        cluster = problem.cluster
        got = plan(problem, "hpp").plan
        costed = sharded_problem(problem) if got.sharding == "optimizer" else problem
        step = evaluate(costed, got)
        pipe_s = max(step.pipeline_time_s)
        print(f"{cluster.name} {model}: step {step.iteration_time_s:.3f} s, slowest pipeline "
              f"{pipe_s:.3f} s, exposed sync {step.exposed_sync_s:.3f} s, {len(got.pipelines)} "
              f"pipelines; samples to shed {_to_shed(got, step)}")  # fmt: skip
        cm = costed.cost_model(got.train.recompute)
        unused = collections.Counter(cluster.gpu(d).name for d in unused_devices(problem, got))
        for name, n in unused.items():
            gpu = next(d.gpu for d in cluster.devices if d.gpu.name == name)
            c = cm.layer_costs(gpu, 1)
            whole_s = c.fwd_cum[-1] + c.bwd_cum[-1]
            print(f"  {n} {name} unused: one sample's whole model {whole_s:.3f} s")
        trials = sorted(_idle_trials(costed, got, step), key=lambda t: -t.samples)
        if not trials:
            print("  no trial: none sheds enough samples within the step and fits in memory")
        for t in trials[:IDLE_TRIALS]:
            first = t.pipelines[0]
            gpu_name = cluster.gpu(first.devices[0]).name
            what = (f"  {len(t.pipelines)} x {len(first.stages)} {gpu_name}"
                    f", mbs {first.micro_batch_size}, m {first.num_micro_batches}: {t.samples} "
                    f"samples, closed form {t.time_s:.3f} s")  # fmt: skip
            trial = _with_trial(costed, got, t, pipe_s)
            if trial is None:
                print(f"{what}; the rest cannot share out or ends no earlier")
                continue
            cost = evaluate(costed, trial)
            print(f"{what}; step {cost.iteration_time_s:.3f} s (fits {cost.fits}), slowest "
                  f"pipeline {max(cost.pipeline_time_s):.3f} s, exposed sync "
                  f"{cost.exposed_sync_s:.3f} s")  # fmt: skip
        sys.stdout.flush()


if __name__ == "__main__":
    main()
