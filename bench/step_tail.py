"""What the *sync* and *optimizer* shares of `bench/planner.py`'s step breakdown are made of.

    .venv/bin/python bench/step_tail.py --only CLUSTER:MODEL [...] [--plans DIR]

After the slowest pipeline ends (`compute`), hpp's step (`step_cost`) is, exactly:

    step = compute + buckets + norm + optimizer + all-gathers

*buckets*: the gradient buckets still running after it (the breakdown's *sync*, with *norm*);
*norm*: the gradient norm's all-reduce over every device, which no optimizer step starts before;
*optimizer*: the slowest device's optimizer step; *all-gathers*: with optimizer sharding
(ZeRO-1), the updated parameters' all-gathers beyond that (the rest of the breakdown's
*optimizer*). Sharded, the all-gathers overlap the next step's forward, so these two are what
the first forwards' waits add past the norm (`cost.sync.overlapped_step_s`), the optimizer step
counted first. Per GPU type it prints the optimizer step, and the bucket that ends the sync: when
it was ready, how long it waited for the buckets ahead of it in the one global order, and how
long it ran. `--plans DIR` keeps each plan as JSON (`bench/imbalance.py`'s).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from imbalance import chosen_plans

from hetpp.cost.step import StepCost, cost_model_for_plan, device_optimizer_time_s, step_cost
from hetpp.specs.plan import Plan


def tail_parts(step: StepCost) -> dict[str, float]:
    """The step after its slowest pipeline, in seconds that add up to it (the module's sum)."""
    compute = max(step.pipeline_time_s)
    sync_end = max([compute, *(b.end_s for b in step.buckets)])
    norm_end = compute + step.exposed_sync_s
    return {
        "compute": compute,
        "buckets": sync_end - compute,
        "norm": norm_end - sync_end,
        # sharded, the all-gathers overlap the next forward (`cost.sync.overlapped_step_s`):
        # what the first forwards' releases add past the norm, the optimizer step counted first
        "optimizer": min(step.optimizer_s, step.iteration_time_s - norm_end),
        # unsharded: 0 up to rounding (the slowest optimizer step ends the step)
        "all-gathers": max(0.0, step.iteration_time_s - norm_end - step.optimizer_s),
    }


def optimizer_by_type(plan: Plan, step: StepCost) -> dict[str, float]:
    """The longest optimizer step of each GPU type's devices, seconds."""
    cm = cost_model_for_plan(plan)
    own: dict[int, list] = {}
    for st in step.stages:
        own.setdefault(st.device, []).append(st)
    out: dict[str, float] = {}
    for stages in own.values():
        t = device_optimizer_time_s(cm, stages, plan.optimizer_shards)
        out[stages[0].gpu] = max(out.get(stages[0].gpu, 0.0), t)
    return out


def main(argv: list[str] | None = None) -> int:
    for cluster_file, model, _, plan_ in chosen_plans(__doc__, argv):
        step = step_cost(plan_, cost_model_for_plan(plan_))
        total = step.iteration_time_s
        parts = tail_parts(step)
        print(
            f"\n{cluster_file.stem} {model} (sharding {plan_.sharding}, "
            f"{plan_.optimizer_shards} shards): step {total * 1e3:.1f} ms = "
            + " + ".join(f"{k} {v * 1e3:.1f} ({v / total:.1%})" for k, v in parts.items())
        )
        print(
            "  optimizer step per type (longest): "
            + ", ".join(f"{g} {t * 1e3:.1f} ms" for g, t in optimizer_by_type(plan_, step).items())
        )
        if step.buckets:
            b = max(step.buckets, key=lambda x: x.end_s)
            print(
                f"  last bucket: {b.bytes / 1e6:.0f} MB over {len(set(b.owners))} owners, ready "
                f"{(b.ready_s - parts['compute']) * 1e3:+.1f} ms from compute end, waited "
                f"{(b.start_s - b.ready_s) * 1e3:.1f} ms, ran {(b.end_s - b.start_s) * 1e3:.1f} ms"
            )
        if step.gathers:
            print(
                f"  all-gathers: {len(step.gathers)}, "
                f"{sum(g.bytes for g in step.gathers) / 1e9:.2f} GB, the longest "
                f"{max(g.end_s - g.start_s for g in step.gathers) * 1e3:.1f} ms"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
