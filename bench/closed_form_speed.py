"""CPU time of the closed-form pipeline time (`hetpp.cost.pipeline.pipeline_time_s`).

    .venv/bin/python bench/closed_form_speed.py
    .venv/bin/python bench/closed_form_speed.py --against OLD/pipeline.py   # before/after

Per schedule, pipelines of 4, 8 and 16 devices (two chunks each under the multi-chunk
schedules) with random stage and hop times, at 8, 16 and 32 micro-batches: microseconds of CPU
time (`time.process_time`) per call, best of `--repeat`. The action graphs
(`hetpp.cost.action_graph.graph`) are cached per (schedule, devices, chunks, m), as in a
search; the first call of each is timed apart ("cold"). `--against` loads another copy of the
module (e.g. from an older commit: `git show REV:src/hetpp/cost/pipeline.py > OLD/pipeline.py`)
and times it in the same run, side by side.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import numpy as np

import hetpp.cost.pipeline as current
from hetpp.cost.action_graph import graph
from hetpp.specs.schedule import SCHEDULES


def load(path: str):
    spec = importlib.util.spec_from_file_location("pipeline_against", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # a copy from before DualPipeV had a rule of its own times it with the one it shared
    mod.TIMING_RULES.setdefault("dualpipe-v", mod.TIMING_RULES["zero-bubble-v"])
    return mod


def cases(schedule: str) -> list[tuple]:
    spec, rng = SCHEDULES[schedule], np.random.default_rng(0)
    chunks = 1 if spec.placement == "one" else 2
    out = []
    for d in (4, 8, 16):
        num = d * chunks
        fwd = list(rng.uniform(0.01, 0.03, num))
        bwd = [2 * f for f in fwd]
        comm = [
            0.0 if spec.device_index(s, d) == spec.device_index(s + 1, d) else rng.uniform(0, 0.01)
            for s in range(num - 1)
        ]
        for m in (8, 16, 32):
            if spec.micro_batch_problem(num, d, m) is None:
                out.append((fwd, bwd, comm, m, schedule, d))
    return out


def per_call_us(mod, items: list[tuple], calls: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        for _ in range(calls):
            for args in items:
                mod.pipeline_time_s(*args)
        best = min(best, time.process_time() - t0)
    return best / (calls * len(items)) * 1e6


def cold_us(items: list[tuple]) -> float:
    graph.cache_clear()
    t0 = time.process_time()
    for args in items:
        current.pipeline_time_s(*args)
    return (time.process_time() - t0) / len(items) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="PATH", help="another pipeline.py to time alongside")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    other = load(args.against) if args.against else None
    head = "| schedule | calls | now: us per call | now, cold graphs |"
    print(head + (" against: us per call | ratio |" if other else ""))
    print("|---" * (4 + 2 * bool(other)) + "|")
    for name in SCHEDULES:
        items = cases(name)
        cold = cold_us(items)
        now = per_call_us(current, items, args.calls, args.repeat)
        row = f"| {name} | {len(items)} | {now:.1f} | {cold:.1f} |"
        if other:
            then = per_call_us(other, items, args.calls, args.repeat)
            row += f" {then:.1f} | {now / then:.2f}x |"
        print(row)


if __name__ == "__main__":
    main()
