"""What cutting stages at half blocks (`planner.halves`) gains on hpp's plans.

    .venv/bin/python bench/halves.py --only CLUSTER:MODEL [...]

For each scenario of `bench/planner.py` (or those named), hpp's search with whole blocks only
(`Problem.half_blocks` False, `hetpp plan --whole-blocks`), then the half-block pass the default
search ends with (`halves.with_half_blocks`: the plan moved to the half-unit layer list, the
stage DP and the cut climb there, kept where 0.5% faster) on its result, which is what
`plan(problem)` returns: both steps, the fraction of the physical limit before and after, the
plan's layer unit, the search's CPU seconds and the pass's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from planner import _chosen, scenarios

from hetpp.planner import Problem, physical_limit_samples_per_s, plan
from hetpp.planner.halves import with_half_blocks
from hetpp.specs import TrainSpec, load_cluster, load_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="CLUSTER or CLUSTER:MODEL (default: every one)")
    args = ap.parse_args(argv)
    print("| scenario | whole blocks | default | speed-up | % of limit | unit | search, pass CPU |")
    print("|---|---|---|---|---|---|---|")
    for path, model, batch, seq in scenarios(False):
        if not _chosen((path, model, batch, seq), args.only):
            continue
        train = TrainSpec(global_batch=batch, seq_len=seq)
        spec, cluster = load_model(model, seq), load_cluster(path)
        problem = Problem(spec, cluster, train, sharding_mode="targeted")
        limit = physical_limit_samples_per_s(problem)
        # one problem for both (its cost models' memos shared, as in the default search)
        problem.half_blocks = False
        t0 = time.process_time()
        whole = plan(problem, "hpp")
        t1 = time.process_time()
        problem.half_blocks = True
        got = with_half_blocks(problem, whole)
        whole_s, pass_s = t1 - t0, time.process_time() - t1
        before, after = whole.iteration_time_s, got.iteration_time_s
        print(
            f"| {path.stem} {model} | {before:.4f} s | {after:.4f} s | {before / after:.3f}x | "
            f"{batch / before / limit:.1%} -> {batch / after / limit:.1%} | "
            f"{got.plan.model.layer_unit} | {whole_s:.2f} s, {pass_s:.2f} s |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
