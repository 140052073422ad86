"""What cutting stages at half blocks (`planner.halves`) gains on hpp's plans.

    .venv/bin/python bench/halves.py --only CLUSTER:MODEL [...]

For each scenario of `bench/planner.py` (or those named), hpp's plan, then `halves_if_faster` on
it (the plan moved to the half-unit layer list, the stage DP and the cut climb there, kept where
the full step cost improves): both steps, the fraction of the physical limit before and after,
and the pass's CPU seconds. The search does not run the pass yet; this measures what it would
add as hpp's last pass.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from planner import _chosen, scenarios

from hetpp.planner import Problem, physical_limit_samples_per_s, plan
from hetpp.planner.halves import halves_if_faster
from hetpp.planner.sharding import sharded_problem
from hetpp.specs import TrainSpec, load_cluster, load_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="CLUSTER or CLUSTER:MODEL (default: every one)")
    args = ap.parse_args(argv)
    print("| scenario | hpp step | with halves | speed-up | % of limit | pass CPU |")
    print("|---|---|---|---|---|---|")
    for path, model, batch, seq in scenarios(False):
        if not _chosen((path, model, batch, seq), args.only):
            continue
        train = TrainSpec(global_batch=batch, seq_len=seq)
        spec, cluster = load_model(model, seq), load_cluster(path)
        problem = Problem(spec, cluster, train, sharding_mode="targeted")
        limit = physical_limit_samples_per_s(problem)
        got = plan(problem, "hpp")
        # the problem the plan was costed with: a ZeRO-1 plan's state bytes are the sharded one's
        costed = sharded_problem(problem) if got.plan.sharding == "optimizer" else problem
        t0 = time.process_time()
        _, step = halves_if_faster(costed, got.plan, got.step)
        took = time.process_time() - t0
        before, after = got.iteration_time_s, step.iteration_time_s
        print(
            f"| {path.stem} {model} | {before:.4f} s | {after:.4f} s | {before / after:.3f}x | "
            f"{batch / before / limit:.1%} -> {batch / after / limit:.1%} | {took:.2f} s |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
