"""End to end on emulated heterogeneous clusters: is hpp's plan faster when trained, and by as much
as predicted?

Per mix of two emulated GPU types (speed ratio, memory): profile gpt-demo on this CPU (cold
caches, one thread; once for all mixes), plan with hpp and every baseline, simulate each plan, then
train every feasible plan with `hetpp train --emulate`, all strategies of a mix in round-robin
order, `--repeats` times, so background load on the machine hits them alike. Reports per mix the
predicted and measured step times, hpp's measured speed-up over each baseline (predicted in
brackets) and the prediction error of every run; writes a markdown record.

    python bench/e2e.py [--steps 7] [--repeats 3] [--mix NAME ...] [--out docs/benchmarks-e2e.md]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

from hetpp.demo.compare import (
    WARMUP_STEPS,
    Candidate,
    Setup,
    best_baseline,
    describe,
    interleaved,
    plan_all,
)
from hetpp.demo.emulated import builtin_cluster, emulated_profiles, profile_cpu
from hetpp.demo.report import markdown_table
from hetpp.profile.table import ProfileTable
from hetpp.specs import PRESETS, Cluster


@dataclass(frozen=True)
class Mix:
    """Two emulated GPU types: (devices, slowdown factor, memory GB) each."""

    name: str
    why: str
    fast: tuple[int, float, float]
    slow: tuple[int, float, float]

    def cluster(self) -> Cluster:
        """The built-in demo cluster (its measured link figures) with these types and counts."""
        d = builtin_cluster().model_dump()
        for i, (n, factor, mem) in enumerate((self.fast, self.slow)):
            d["gpu_types"][i].update(emulate_slowdown=factor, memory_gb=mem)
            d["nodes"][i]["gpus_per_node"] = n
        d["name"] = self.name
        return Cluster.model_validate(d)


MIXES = (
    Mix("demo", "the `hetpp demo` cluster: 4x speed ratio", (3, 4, 0.06), (4, 16, 0.05)),
    Mix("ratio-3x", "smaller speed gap, more memory per fast device", (2, 4, 0.08), (4, 12, 0.05)),
    Mix(
        "slow-cannot-hold-model",
        "no split of the model over the 4 slow devices fits their memory (the fullest stage needs "
        "44 MB or more): the slow type cannot hold the model alone, hpp mixes types in a pipeline",
        (3, 4, 0.08),
        (4, 12, 0.03),
    ),
    Mix("ratio-6x", "a slow type 6x slower than the fast one", (3, 4, 0.06), (3, 24, 0.03)),
)


METHOD = """## How predictions were made comparable with emulated runs

Before these steps, predictions came out 10-25% short of the measured step times, and runs of one
plan differed by as much. Three model inputs are measured rather than assumed, and one harness
defect was fixed:

1. **Emulation absorbs descheduling** (`runtime/stage.py`): a forward or backward of a device with
   factor f ends f x its CPU time after it began. Sleeping (f - 1) x its CPU time after the call,
   as first built, added the time the rank had spent descheduled within the call: with 6-7 ranks
   and other work on 2 cores, calls took 1.3-2.8x their CPU time in wall time before the sleep.
2. **Cold-cache profile** (`runtime.profiler`, `cold=True`): between two of its calls an emulated
   rank sleeps while other ranks run and evict its weights. Measured in the runs, a rank's compute
   was 10-20% above a hot-cache profile at micro-batch 1, within 6% of a cold one (13 of the 14
   ranks of hpp's and layer-balanced's demo plans; the other +18%).
3. **Links and optimizer**: gloo over loopback as `bench/loopback.py` measures it (the cluster
   file's 1.6 GB/s and 200 us; across the measured 0.8-1.7 GB/s and 40-530 us, predictions move
   less than 0.5%); AdamW on one core at 15 GB/s in the cost model's terms (the optimizer step is
   not stretched by emulation).

What remains: noise from other work on the two shared cores (runs of one plan differ by up to 15%,
hence the interleaved repeats and medians); the per-call Python overhead of
torch.distributed.pipelining (about 0.2 ms of CPU, stretched by the factor, not in the profile);
and the cache state, for which cold is right when many ranks share the cores and pessimistic when
few do (data-balanced on ratio-3x, two ranks: +10%). Memory is not enforced on CPU: the emulated
types' sizes shape the plans only (every stage of every plan fits its device in the cost model).
"""


def run_mix(
    mix: Mix, profiles_cpu: ProfileTable, steps: int, repeats: int, work: Path
) -> tuple[Setup, list[Candidate]]:
    """Plan, simulate and train every feasible strategy of one mix; hpp first."""
    cluster = mix.cluster()
    profiles = emulated_profiles(profiles_cpu, cluster)
    setup = Setup(cluster, PRESETS["gpt-demo"])
    cands = plan_all(setup.problem(profiles), profiles)
    feasible = [c for c in cands.values() if c.feasible]

    def announce(c: Candidate, r: int):
        print(f"  {mix.name}: training {c.strategy} ({describe(c.plan)}), run {r + 1}", flush=True)

    interleaved(feasible, steps, repeats, work / mix.name, announce)
    return setup, list(cands.values())


TARGET_PREDICTED = 1.5
"""Where the simulator predicts hpp at least this much faster than the best baseline ..."""
TARGET_MEASURED = 1.3
"""... the trained runs must show at least this."""


def summary_rows(mix: Mix, cands: list[Candidate]) -> list[str]:
    """Markdown rows, one per trained baseline: hpp's predicted and measured speed-up over it,
    per run too (run r of hpp against run r of the baseline: they ran back to back)."""
    hpp, best = cands[0], best_baseline({c.strategy: c for c in cands})
    rows = []
    for c in cands[1:]:
        if not c.measured:
            continue
        pred, meas = c.predicted_s / hpp.predicted_s, c.measured_s / hpp.measured_s
        check = ""
        if c.strategy == best:
            check = "yes" if pred < TARGET_PREDICTED or meas >= TARGET_MEASURED else "**no**"
        per_run = ", ".join(f"{b / h:.2f}x" for b, h in zip(c.measured, hpp.measured))
        rows.append(
            f"| {mix.name} | {c.strategy}{' (best)' if c.strategy == best else ''} | "
            f"{pred:.2f}x | {meas:.2f}x | {per_run} | {check} |"
        )
    return rows


def run_errors(cands: list[Candidate]) -> list[float]:
    """Prediction error (predicted / measured - 1) of every run."""
    return [c.predicted_s / m - 1 for c in cands for m in c.measured]


def mix_section(mix: Mix, setup: Setup, cands: list[Candidate]) -> str:
    """A mix's markdown: what it is, every strategy's row, every run's step time."""
    runs = "\n".join(
        f"- {c.strategy}: {', '.join(f'{m:.2f}' for m in c.measured)} s "
        f"(error {', '.join(f'{c.predicted_s / m - 1:+.0%}' for m in c.measured)})"
        for c in cands
        if c.measured
    )
    return (
        f"### {mix.name}\n\n{mix.why}: {_types(mix)}.\n\n"
        f"{markdown_table(cands, setup.global_batch)}\n\nStep time of each run:\n\n{runs}\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=7, help=f"steps per run ({WARMUP_STEPS} warm-up)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every plan, interleaved")
    ap.add_argument("--mix", nargs="+", choices=[m.name for m in MIXES], help="default: all")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks-e2e.md"))
    args = ap.parse_args()
    mixes = [m for m in MIXES if not args.mix or m.name in args.mix]
    t0 = time.perf_counter()
    cpu = profile_cpu(PRESETS["gpt-demo"], 128, [1, 2, 4])
    sections, summary, errors = [], [], []
    with TemporaryDirectory() as tmp:
        for mix in mixes:
            print(f"{mix.name}: {mix.why}", flush=True)
            setup, cands = run_mix(mix, cpu, args.steps, args.repeats, Path(tmp))
            sections.append(mix_section(mix, setup, cands))
            summary += summary_rows(mix, cands)
            errors += run_errors(cands)
            print(sections[-1], flush=True)
    head = [
        "| mix | baseline | hpp speed-up, predicted | measured | measured, per run | "
        f"target met (>= {TARGET_MEASURED}x where >= {TARGET_PREDICTED}x predicted) |",
        "|---|---|---|---|---|---|",
    ]
    result = "\n".join(head + summary)
    med = statistics.median(abs(e) for e in errors)
    err_line = (
        f"Prediction error of the step time over all {len(errors)} runs: median |error| "
        f"{med:.1%}, largest {max(errors, key=abs):+.0%}."
    )
    print(result + "\n\n" + err_line)
    _write(args, result, err_line, sections, time.perf_counter() - t0)
    return 0


def _types(mix: Mix) -> str:
    (nf, ff, mf), (ns, fs, ms) = mix.fast, mix.slow
    return (
        f"{nf} x Fast ({ff:g}x slower than one core, {mf * 1e3:g} MB), "
        f"{ns} x Slow ({fs:g}x, {ms * 1e3:g} MB)"
    )


def _write(args, result: str, err_line: str, sections: list[str], wall_s: float) -> None:
    command = " ".join(["python bench/e2e.py", *map(shlex.quote, sys.argv[1:])])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        "# End to end: planned, predicted and trained on emulated heterogeneous clusters\n\n"
        f"Command: `{command}` ({wall_s / 60:.0f} min on {os.cpu_count()} cores, shared with "
        "other work)\n\n"
        "gpt-demo (8 blocks, hidden 256), sequence 128, global batch 24, float32, AdamW, gloo, "
        "one process and one thread per emulated device (`hetpp train --emulate`). Every plan "
        f"that fits was trained {args.repeats} time(s) for {args.steps} steps, the strategies of a "
        "mix in round-robin order; a run's step time is the median over its steps after the "
        f"first {WARMUP_STEPS}; tables show the median over runs. Predicted: the simulator's "
        "step time on this CPU's profile (cold caches, one thread) scaled per type by its "
        "emulation factor; error = predicted / measured - 1.\n\n"
        f"## Summary\n\n{result}\n\n{err_line}\n\n{METHOD}\n## Per mix\n\n" + "\n".join(sections)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
