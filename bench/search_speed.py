"""hpp search time at 64, 1024 and 8192 GPUs, median of repeats, optionally against an older
tree side by side.

    .venv/bin/python bench/search_speed.py [--repeat 3] [--against 7e505cc] [--sizes 64 1024]
        [--strategy best] [--sharding targeted]

Clusters: `lab-64` and `mega-1024` from the planner suite, and `mega-1024` with every node group
8 times as large (8192 GPUs); gpt3-13b, seq 2048, 4 samples per GPU; the strategy `hetpp plan`
runs by default (`best`: hpp and the FSDP family, schedule pass included) under the optimizer
sharding `hetpp plan` runs by default (`targeted`; a tree that lacks the mode asked for runs
`none`, one without the strategy `hpp`, and the line says what each side ran). Each search runs in a
fresh subprocess and is timed inside it (imports excluded), in wall-clock and in CPU seconds
(the machine is shared: CPU time is what load inflates least). `--against REF` unpacks `src/` as it
was at git commit REF (`git archive`) and times the same searches with it, alternating old and
new runs so that the shared machine's load hits both alike; it prints new/old ratios and whether
the two found plans of the same cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).parent
MODEL, SEQ, SAMPLES_PER_GPU = "gpt3-13b", 2048, 4


def clusters() -> dict[int, dict]:
    """Cluster files by GPU count: 64, 1024 and 8192."""
    lab = yaml.safe_load((HERE / "scenarios" / "lab-64.yaml").read_text())
    mega = yaml.safe_load((HERE / "scenarios" / "mega-1024.yaml").read_text())
    huge = {**mega, "name": "mega-8192"}
    huge["nodes"] = [{**g, "count": g["count"] * 8} for g in mega["nodes"]]
    return {64: lab, 1024: mega, 8192: huge}


def _one(cluster: dict, strategy: str, sharding: str) -> None:
    """Child process: one search, its time, plan cost and sharding mode as JSON on stdout."""
    from typing import get_args

    import hetpp.planner as planner
    from hetpp.planner import Problem, plan
    from hetpp.specs import Cluster, TrainSpec, load_model

    try:
        from hetpp.planner.problem import ShardingMode

        modes = get_args(ShardingMode)
    except ImportError:  # a tree from before optimizer sharding (8ec0738, issue 13's start)
        modes = ()

    cl = Cluster.model_validate(cluster)
    spec = load_model(MODEL, SEQ)
    train = TrainSpec(global_batch=SAMPLES_PER_GPU * cl.num_devices, seq_len=SEQ)
    t0, c0 = time.perf_counter(), time.process_time()
    mode = sharding if sharding in modes else "none"
    kw = {"sharding_mode": mode} if modes else {}
    # a tree from before the FSDP family has no "best": `hetpp plan` ran hpp there
    known = {*planner.STRATEGIES, getattr(planner, "BEST", None)}
    strategy = strategy if strategy in known else "hpp"
    r = plan(Problem(spec, cl, train, **kw), strategy)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        json.dumps(
            {
                "time_s": wall,
                "cpu_s": cpu,
                "step_s": r.iteration_time_s,
                "mode": f"{strategy}, {mode}",
            }
        )
    )


def time_search(
    cluster: dict, src: Path, strategy: str, sharding: str
) -> tuple[float, float, float, str]:
    """(search seconds, its CPU seconds, iteration time of the plan, "strategy, sharding mode"
    it ran) with the package under `src`."""
    got = child_json("search_speed", f"_one({cluster!r}, {strategy!r}, {sharding!r})", src)
    return got["time_s"], got["cpu_s"], got["step_s"], got["mode"]


def child_json(module: str, call: str, src: Path) -> dict:
    """Run `call` of the bench module `module` in a fresh interpreter with the package under
    `src`; the JSON of its last line of output."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import {module} as s; s.{call}"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def unpack(ref: str) -> Path:
    """`src/` as it was at git commit `ref`, in a temporary folder."""
    tmp = Path(tempfile.mkdtemp())
    tar = tmp / "src.tar"
    with open(tar, "wb") as f:
        subprocess.run(["git", "archive", ref, "src"], cwd=HERE.parent, check=True, stdout=f)
    with tarfile.open(tar) as t:
        t.extractall(tmp, filter="data")
    return tmp / "src"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", help="git commit whose src/ to time side by side")
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 1024, 8192])
    ap.add_argument("--strategy", default="best", help="planner strategy (default: best)")
    ap.add_argument(
        "--sharding", default="targeted", help="optimizer sharding mode (default: targeted)"
    )
    args = ap.parse_args(argv)
    variants = {"new": HERE.parent / "src"}
    if args.against:
        variants["old"] = unpack(args.against)
    every = clusters()
    for size in args.sizes:
        cl = every[size]
        times: dict[str, list[float]] = {k: [] for k in variants}
        cpus: dict[str, list[float]] = {k: [] for k in variants}
        steps: dict[str, float] = {}
        modes: dict[str, str] = {}
        for _ in range(args.repeat):
            for name, src in variants.items():
                t, c, steps[name], modes[name] = time_search(cl, src, args.strategy, args.sharding)
                times[name].append(t)
                cpus[name].append(c)
        med = {k: statistics.median(v) for k, v in times.items()}
        cpu = {k: statistics.median(v) for k, v in cpus.items()}
        line = f"{cl['name']:>10} {size:>5} GPUs: " + ", ".join(
            f"{k} ({modes[k]}) median {med[k]:.2f} s, CPU {cpu[k]:.2f} s "
            f"(runs {' '.join(f'{x:.2f}' for x in times[k])})"
            for k in variants
        )
        if "old" in med:
            same = "same plan cost" if steps["old"] == steps["new"] else "PLAN COST DIFFERS"
            line += f"; new/old {med['new'] / med['old']:.2f}, CPU {cpu['new'] / cpu['old']:.2f}"
            line += f" ({same}: {steps['new']:.4f} s vs {steps['old']:.4f} s)"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
