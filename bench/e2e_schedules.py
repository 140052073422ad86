"""End to end: hpp's best one-chunk (1F1B) plan against a plan with multi-chunk schedules, both
trained on an emulated cluster, with the cost model's predicted gain beside the measured one.

The multi-chunk plan is the planner's own pick when its schedule pass chooses one (`hpp` with the
executable schedules allowed); otherwise (or with `--recut`) it is made from the 1F1B plan: every
pipeline of two or more devices is re-cut for `--schedule` on the same devices, each device keeping
its layer count, split into two chunks (the first the larger) placed as the schedule says; batch
shares and micro-batches stay; a pipeline the schedule cannot run stays 1F1B. The plans train
round-robin, `--repeats` times, so background load hits them alike. Predicted: `step_cost` of each
plan on the emulated profiles the planner used.

    python bench/e2e_schedules.py [--mix demo] [--schedule zbv] [--recut] [--steps 7] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).parent))
from e2e import MIXES

from hetpp.cost.step import cost_model_for_plan, step_cost
from hetpp.demo.compare import WARMUP_STEPS, Setup, describe
from hetpp.demo.emulated import emulated_profiles, profile_cpu
from hetpp.demo.runs import train_plan
from hetpp.planner import plan
from hetpp.runtime.contract import check_executable
from hetpp.specs import PRESETS, PipelinePlan, Plan, StagePlan
from hetpp.specs.errors import SpecError
from hetpp.specs.schedule import SCHEDULES


def rechunk(pipe: PipelinePlan, schedule: str) -> PipelinePlan:
    """`pipe` on `schedule` with two chunks per device, or `pipe` itself where it cannot run."""
    spec, devices = SCHEDULES[schedule], pipe.devices
    counts = [st.num_layers for st in pipe.stages]
    if len(devices) < 2 or min(counts) < 2:
        return pipe
    chunk = Counter[int]()
    stages, start = [], 0
    for i in range(2 * len(devices)):
        d = spec.device_index(i, len(devices))
        n = (counts[d] + 1) // 2 if chunk[d] == 0 else counts[d] // 2
        chunk[d] += 1
        stages.append(StagePlan(devices=(devices[d],), layers=(start, start + n)))
        start += n
    return pipe.model_copy(update={"stages": tuple(stages), "schedule": schedule})


def multi_chunk(p: Plan, schedule: str) -> Plan:
    """`p` with every pipeline that the plan check and the runtime's contract accept re-cut."""
    pipes = list(p.pipelines)
    for i, pipe in enumerate(p.pipelines):
        trial = (*pipes[:i], rechunk(pipe, schedule), *pipes[i + 1 :])
        candidate = p.model_copy(update={"pipelines": trial, "grad_blocks": None, "estimate": None})
        try:
            check_executable(candidate.validate_plan())
        except SpecError:
            continue
        pipes = list(trial)
    return p.model_copy(
        update={"pipelines": tuple(pipes), "grad_blocks": None, "estimate": None}
    ).with_derived()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mix", default="demo", choices=[m.name for m in MIXES])
    multi = [name for name, s in SCHEDULES.items() if s.executable and s.multi_stage]
    ap.add_argument("--schedule", default="zbv", choices=multi)
    ap.add_argument("--recut", action="store_true", help="re-cut the 1F1B plan for --schedule")
    ap.add_argument("--steps", type=int, default=7, help=f"steps per run ({WARMUP_STEPS} warm-up)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each plan, interleaved")
    args = ap.parse_args()
    mix = next(m for m in MIXES if m.name == args.mix)
    t0 = time.perf_counter()
    cluster = mix.cluster()
    profiles = emulated_profiles(profile_cpu(PRESETS["gpt-demo"], 128, [1, 2, 4]), cluster)
    setup = Setup(cluster, PRESETS["gpt-demo"])
    problem = setup.problem(profiles)
    base = plan(replace(problem, schedules=()), "hpp").final_plan()
    picked = plan(problem, "hpp").final_plan()
    chunked = any(q.chunks > 1 for q in picked.pipelines)
    if chunked and not args.recut:
        plans = {"1f1b": base, "planner": picked}
    else:
        plans = {"1f1b": base, args.schedule: multi_chunk(base, args.schedule)}
    predicted = {
        name: step_cost(p, cost_model_for_plan(p, profiles)).iteration_time_s
        for name, p in plans.items()
    }
    for name, p in plans.items():
        spans = [[(st.device, st.layers) for st in pipe.stages] for pipe in p.pipelines]
        scheds = [q.schedule_in(p.train).name for q in p.pipelines]
        print(f"{name}: {describe(p)}; {scheds}; m {[q.num_micro_batches for q in p.pipelines]}; "
              f"{spans}; predicted {predicted[name]:.3f} s/step")  # fmt: skip
    runs: dict[str, list[float]] = {name: [] for name in plans}
    with TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, p in plans.items():
                times = train_plan(p, args.steps, Path(tmp), f"{name}-{r}")["step_times_s"]
                runs[name].append(statistics.median(times[WARMUP_STEPS:]))
                print(f"  run {r + 1} {name}: {runs[name][-1]:.3f} s/step", flush=True)
    med = {name: statistics.median(v) for name, v in runs.items()}
    print(
        "\n| plan | pipelines | s/step per run | median s/step | predicted s/step "
        "| gain measured | gain predicted |\n|---|---|---|---|---|---|---|"
    )
    for name, p in plans.items():
        per = ", ".join(f"{t:.2f}" for t in runs[name])
        gain = med["1f1b"] / med[name]
        print(
            f"| {name} | {describe(p)} | {per} | {med[name]:.2f} | {predicted[name]:.2f} "
            f"| {gain:.2f}x | {predicted['1f1b'] / predicted[name]:.2f}x |"
        )
    print(f"\n{(time.perf_counter() - t0) / 60:.0f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
