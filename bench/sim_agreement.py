"""How far the cost model's closed form (`step_cost`) is from the event simulator.

    .venv/bin/python bench/sim_agreement.py                  # the built-in plan set (simplans.py)
    .venv/bin/python bench/sim_agreement.py PLAN.json DIR/   # plan files, or directories of them
    .venv/bin/python bench/sim_agreement.py --markdown       # tables for docs/benchmarks-sim.md

Per plan: (closed - simulated) / simulated for the iteration time and for every pipeline, and
the difference in exposed gradient-sync time as a share of the simulated step. Plans
the cost model says do not fit memory are reported apart: a planner never ranks them. For
reference, the pipeline column also shows the 1F1B form before the simulator corrected it
(`fill + (m - 1) x slowest stage`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from simplans import Case, cases

from hetpp.cost.pipeline import beat_s
from hetpp.cost.step import cost_model_for_plan, stage_costs, step_cost
from hetpp.profile.table import load_profiles
from hetpp.sim import compare_with_cost
from hetpp.specs.plan import load_plan


def plan_files(paths: list[str]) -> Iterator[Case]:
    for p in map(Path, paths):
        files = sorted(p.rglob("*.json")) if p.is_dir() else [p]
        for f in files:
            yield Case(str(f), load_plan(f))


def old_form(plan, cm) -> list[float]:
    """The pipeline closed form before this benchmark: transfers only in the fill."""
    stages, _ = stage_costs(plan, cm)
    out, r = [], 0
    for pipe in plan.pipelines:
        st = stages[r : r + len(pipe.stages)]
        r += len(st)
        fill = sum(s.fwd_s + s.bwd_s + 2 * s.send_s for s in st)
        # the beat as if links were free: slowest f+b for 1F1B, slowest f + slowest b for GPipe
        free = [0.0] * (len(st) - 1)
        beat = beat_s(
            [s.fwd_s for s in st], [s.bwd_s for s in st], free, plan.schedule, len(pipe.devices)
        )
        out.append(fill + (pipe.num_micro_batches - 1) * beat)
    return out


def measure(items: Iterator[Case], profiles) -> list[dict]:
    rows = []
    for case in items:
        cm = cost_model_for_plan(case.plan, profiles)
        a = compare_with_cost(case.plan, cm)
        old = old_form(case.plan, cm)
        rows.append(
            {
                "name": case.name,
                "schedule": case.plan.schedule,
                "fits": step_cost(case.plan, cm).fits,
                "iteration": a.rel_diff,
                # as a share of the step, since exposed sync is often 0 on one side
                "sync": (a.closed_exposed_sync_s - a.simulated_exposed_sync_s) / a.simulated_s,
                "pipelines": list(a.pipeline_rel_diff),
                "old_pipelines": [(o - s) / s for o, s in zip(old, a.simulated_pipeline_s)],
            }
        )
    return rows


def stats(values: list[float]) -> str:
    v = np.array(values)
    a = np.abs(v)
    return (
        f"{len(v)} | {np.median(a):.2%} | {np.percentile(a, 90):.2%} | {a.max():.2%} | "
        f"{v.min():+.2%} | {v.max():+.2%}"
    )


def report(rows: list[dict], top: int, seconds: float) -> None:
    head = "| plans | what | n | median abs | p90 abs | max abs | min | max |"
    print(head)
    print("|" + "---|" * 8)
    for label, sel in (("fit memory", [r for r in rows if r["fits"]]), ("all", rows)):
        if not sel:
            continue
        it = [r["iteration"] for r in sel]
        pipes = [x for r in sel for x in r["pipelines"]]
        old = [x for r in sel for x in r["old_pipelines"]]
        print(f"| {label} | iteration time | {stats(it)} |")
        print(f"| {label} | exposed sync, share of step | {stats([r['sync'] for r in sel])} |")
        print(f"| {label} | pipeline time | {stats(pipes)} |")
        print(f"| {label} | pipeline, old 1F1B form | {stats(old)} |")
    print("\nPer schedule, plans that fit memory:\n")
    print("| schedule | what | n | median abs | p90 abs | max abs | min | max |")
    print("|" + "---|" * 8)
    for name in dict.fromkeys(r["schedule"] for r in rows):
        sel = [r for r in rows if r["fits"] and r["schedule"] == name]
        if sel:
            print(f"| {name} | iteration time | {stats([r['iteration'] for r in sel])} |")
            pipes = [x for r in sel for x in r["pipelines"]]
            print(f"| {name} | pipeline time | {stats(pipes)} |")
    print(f"\n{len(rows)} plans in {seconds:.1f} s. Largest iteration-time differences:\n")
    print("| plan | fits | iteration | worst pipeline |")
    print("|---|---|---|---|")
    for r in sorted(rows, key=lambda r: -abs(r["iteration"]))[:top]:
        worst = max(r["pipelines"], key=abs)
        fits = "yes" if r["fits"] else "no"
        print(f"| {r['name']} | {fits} | {r['iteration']:+.2%} | {worst:+.2%} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="plan JSON files or directories (default: built-in)")
    ap.add_argument("--profile", nargs="*", default=[], metavar="CSV")
    ap.add_argument("--top", type=int, default=10, help="list this many worst plans")
    ap.add_argument("--schedule", nargs="*", default=[], help="only the built-in plans of these")
    ap.add_argument("--json", metavar="PATH", help="also write every plan's row to this file")
    args = ap.parse_args()
    t0 = time.perf_counter()
    items = plan_files(args.paths) if args.paths else cases()
    if args.schedule:
        items = (c for c in items if c.plan.schedule in args.schedule)
    rows = measure(items, load_profiles(args.profile))
    report(rows, args.top, time.perf_counter() - t0)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
