"""End to end: hpp's 1F1B plan against the same plan with its pipelines on a multi-chunk schedule,
both trained on an emulated cluster.

The planner does not choose schedules yet (the planning half of issue 13), so the multi-chunk
plan is made from hpp's: every pipeline of two or more devices is re-cut for `--schedule` on the
same devices, each device keeping its layer count, split into two chunks (the first the larger)
placed as the schedule says; batch shares and micro-batches stay. A pipeline the schedule cannot
run (too few micro-batches, a device with one layer) stays 1F1B. Both plans train round-robin,
`--repeats` times, so background load hits them alike. Measured only: there is no cost model for
these schedules on main yet, so no predicted gain.

    python bench/e2e_schedules.py [--mix demo] [--schedule zbv] [--steps 7] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).parent))
from e2e import MIXES

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
    ap.add_argument(
        "--schedule", default="zbv", choices=["interleaved-1f1b", "interleaved-zb", "zbv"]
    )
    ap.add_argument("--steps", type=int, default=7, help=f"steps per run ({WARMUP_STEPS} warm-up)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each plan, interleaved")
    args = ap.parse_args()
    mix = next(m for m in MIXES if m.name == args.mix)
    t0 = time.perf_counter()
    cluster = mix.cluster()
    profiles = emulated_profiles(profile_cpu(PRESETS["gpt-demo"], 128, [1, 2, 4]), cluster)
    setup = Setup(cluster, PRESETS["gpt-demo"])
    base = plan(setup.problem(profiles), "hpp").final_plan()
    plans = {"1f1b": base, args.schedule: multi_chunk(base, args.schedule)}
    for name, p in plans.items():
        spans = [[(st.device, st.layers) for st in pipe.stages] for pipe in p.pipelines]
        print(f"{name}: {describe(p)}; m {[q.num_micro_batches for q in p.pipelines]}; {spans}")
    runs: dict[str, list[float]] = {name: [] for name in plans}
    with TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, p in plans.items():
                times = train_plan(p, args.steps, Path(tmp), f"{name}-{r}")["step_times_s"]
                runs[name].append(statistics.median(times[WARMUP_STEPS:]))
                print(f"  run {r + 1} {name}: {runs[name][-1]:.3f} s/step", flush=True)
    med = {name: statistics.median(v) for name, v in runs.items()}
    print(
        "\n| plan | pipelines | s/step per run | median s/step | vs 1f1b |\n|---|---|---|---|---|"
    )
    for name, p in plans.items():
        per = ", ".join(f"{t:.2f}" for t in runs[name])
        print(
            f"| {name} | {describe(p)} | {per} | {med[name]:.2f} | {med['1f1b'] / med[name]:.2f}x |"
        )
    print(f"\n{(time.perf_counter() - t0) / 60:.0f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
