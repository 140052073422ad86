"""What hpp's micro-batch-size pass (`hetpp.planner.mixed_mbs`) changes on the planner suite.

    .venv/bin/python bench/mixed_mbs.py [--quick]

Runs hpp's search on every scenario of `bench/scenarios/suite.yaml` (as `bench/planner.py`
does) and, inside the same search, records the plan the pass is given and the one it returns:
step times before and after, the fraction of the physical limit each reaches, the sizes per
pipeline, and the pass's own CPU seconds (`time.process_time`: the machine is shared).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import planner as suite

import hetpp.planner.search as search
from hetpp.planner import Problem, physical_limit_samples_per_s, plan
from hetpp.specs import TrainSpec, load_cluster, load_model


def _sizes(p) -> str:
    counts: dict[tuple[int, str], int] = {}
    for pipe in p.pipelines:
        key = (pipe.micro_batch_size, f"{len(pipe.devices)}-dev")
        counts[key] = counts.get(key, 0) + 1
    return " + ".join(f"{n}x mbs {b} ({d})" for (b, d), n in sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the quick scenarios, one model")
    args = ap.parse_args(argv)
    inner = search.mix_micro_batch_sizes
    seen: list[tuple] = []

    def timed(problem, ws, p, step):
        t0 = time.process_time()
        got = inner(problem, ws, p, step)
        seen.append((p, step, *got, time.process_time() - t0))
        return got

    search.mix_micro_batch_sizes = timed
    print("| cluster | model | before | after | % of limit | pass CPU | sizes after |")
    print("|---|---|---|---|---|---|---|")
    for cluster_file, model, batch, seq in suite.scenarios(args.quick):
        cluster = load_cluster(cluster_file)
        problem = Problem(
            load_model(model, seq), cluster, TrainSpec(global_batch=batch, seq_len=seq)
        )
        limit = physical_limit_samples_per_s(problem)
        seen.clear()
        plan(problem, "hpp")
        _, before, after_plan, after, cpu = seen[-1]
        frac = [batch / s.iteration_time_s / limit for s in (before, after)]
        sizes = _sizes(after_plan) if after is not before else "unchanged"
        print(
            f"| {cluster.name} | {model} | {before.iteration_time_s:.4f} s | "
            f"{after.iteration_time_s:.4f} s | {frac[0]:.1%} -> {frac[1]:.1%} | {cpu:.2f} s | "
            f"{sizes} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
