"""hpp search time at 64, 1024 and 8192 GPUs, median of repeats, optionally against an older
placement side by side.

    .venv/bin/python bench/search_speed.py [--repeat 3] [--against 63c9db2]

Clusters: `lab-64` and `mega-1024` from the planner suite, and `mega-1024` with every node group
8 times as large (8192 GPUs); gpt3-13b, seq 2048, 4 samples per GPU. `--against REF` loads
`planner/placement.py` as it was at git commit REF (`git show`) and times the search with it
too, alternating old and new runs so that the shared machine's load hits both alike; it prints
new/old ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import hetpp.planner.assemble as assemble
from hetpp.planner import Problem, plan
from hetpp.specs import Cluster, TrainSpec, load_model

HERE = Path(__file__).parent
MODEL, SEQ, SAMPLES_PER_GPU = "gpt3-13b", 2048, 4


def clusters() -> list[Cluster]:
    """64, 1024 and 8192 GPUs."""
    lab = yaml.safe_load((HERE / "scenarios" / "lab-64.yaml").read_text())
    mega = yaml.safe_load((HERE / "scenarios" / "mega-1024.yaml").read_text())
    huge = {**mega, "name": "mega-8192"}
    huge["nodes"] = [{**g, "count": g["count"] * 8} for g in mega["nodes"]]
    return [Cluster.model_validate(c) for c in (lab, mega, huge)]


def old_place(ref: str):
    """`place` from planner/placement.py at git commit `ref`."""
    src = subprocess.run(
        ["git", "show", f"{ref}:src/hetpp/planner/placement.py"],
        cwd=HERE.parent,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_placement.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_placement", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.place


def time_search(cluster: Cluster, place) -> tuple[float, float]:
    """(search seconds, iteration time of the plan) with `place` as the placement."""
    spec = load_model(MODEL, SEQ)
    batch = SAMPLES_PER_GPU * cluster.num_devices
    saved, assemble.place = assemble.place, place
    try:
        t0 = time.perf_counter()
        r = plan(Problem(spec, cluster, TrainSpec(global_batch=batch, seq_len=SEQ)))
        return time.perf_counter() - t0, r.iteration_time_s
    finally:
        assemble.place = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", help="git commit whose placement to time side by side")
    args = ap.parse_args(argv)
    variants = {"new": assemble.place}
    if args.against:
        variants["old"] = old_place(args.against)
    for cl in clusters():
        times: dict[str, list[float]] = {k: [] for k in variants}
        steps: dict[str, float] = {}
        for _ in range(args.repeat):
            for name, place in variants.items():
                t, steps[name] = time_search(cl, place)
                times[name].append(t)
        med = {k: statistics.median(v) for k, v in times.items()}
        line = f"{cl.name:>10} {cl.num_devices:>5} GPUs: " + ", ".join(
            f"{k} median {med[k]:.2f} s (runs {' '.join(f'{x:.2f}' for x in times[k])})"
            for k in variants
        )
        if "old" in med:
            same = "same plan cost" if steps["old"] == steps["new"] else "PLAN COST DIFFERS"
            line += f"; new/old {med['new'] / med['old']:.2f} ({same})"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
