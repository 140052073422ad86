"""Search quality: hpp's default search against the exact reference on clusters of 8-64 GPUs.

    .venv/bin/python bench/search_quality.py [--out docs/benchmarks-search.md] [--only T4 ...]
    .venv/bin/python bench/search_quality.py --cpu-against ebc6d21 [--repeat 3]

On clusters past `search.EXACT_STATES` device-count vectors the default search decomposes
(per-type knapsack, a few mixed templates, local moves; on three-type clusters of at most
`search.CHUNKED_STATES`, the chunk-aware count DP over every composition). Two references: hpp's
exact path (`plan` with `search._search_exact` on every cluster: exact in one-chunk compute
time, its chunk-aware DP at the cheap price, its best few plans then get the schedule pass and
the micro-batch size pass) and the exact reference (`planner.exact.search_exact`: the count DP
over every template and every multi-chunk schedule priced in full, so exact in compute time over
layouts and per-pipeline schedules at one micro-batch size, plus the exact path as hpp runs it,
so never above the exact path column; what it does not cover: its module docstring). A negative
gap means the default found a plan outside what the reference covers. Per cluster it prints the
three iteration times, the gap to the exact reference and the search times. Target: the default
within 1% of exact on every cluster (issue 12). `--cpu-against REF` instead times the default
search alone in CPU seconds per cluster, in this tree and in `src/` at git commit REF side by
side (a fresh subprocess per search, old and new alternated, median of `--repeat`). `--only
SUBSTRING` (repeatable) keeps the clusters whose name ("4x H100-80GB + 60x T4") contains any of
them, or (digits) whose 0-based index it is; `--plans` prints the default's and the exact
reference's pipelines too (GPU types in stage order, schedule, micro-batch size x count).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import hetpp.planner.search as search
from hetpp.planner import Problem, plan
from hetpp.planner.exact import search_exact
from hetpp.specs import Cluster, NodeGroup, TrainSpec, load_model

CASES: list[tuple[tuple[tuple[str, int, int], ...], str, int]] = [
    ((("A100-80GB", 4, 1), ("RTX-4090", 4, 1)), "gpt3-1.3b", 64),
    ((("A100-80GB", 4, 1), ("V100-16GB", 4, 1), ("T4", 4, 1)), "gpt3-2.7b", 64),
    ((("A100-80GB", 3, 1), ("V100-16GB", 5, 1), ("T4", 7, 1)), "gpt3-2.7b", 64),
    ((("H100-80GB", 4, 1), ("T4", 4, 3)), "gpt3-13b", 128),
    ((("L40S", 8, 1), ("A100-80GB", 8, 1)), "gpt3-13b", 128),
    ((("A100-80GB", 4, 2), ("RTX-4090", 4, 2)), "llama2-7b", 128),
    ((("H100-80GB", 8, 2), ("A100-40GB", 8, 2)), "llama3-8b", 256),
    ((("A100-40GB", 8, 2), ("V100-16GB", 8, 4)), "llama2-13b", 256),
    ((("A100-40GB", 8, 4), ("V100-16GB", 8, 4)), "gpt3-2.7b", 256),
    ((("H100-80GB", 4, 1), ("T4", 4, 15)), "gpt3-2.7b", 256),
    ((("A100-80GB", 8, 1), ("L4", 8, 1), ("T4", 8, 1)), "gpt3-6.7b", 128),
    ((("A100-80GB", 8, 4), ("RTX-4090", 8, 4)), "llama2-7b", 512),
]
"""(node groups as (GPU type, GPUs per node, nodes), model, global batch); seq 2048."""

SEQ = 2048


def cluster(groups: tuple[tuple[str, int, int], ...]) -> Cluster:
    """Nodes with 100 GB/s inside, 25 GB/s between (as the planner tests' clusters)."""
    nodes = [
        NodeGroup(gpu=g, gpus_per_node=n, count=c, intra_node_GBps=100.0) for g, n, c in groups
    ]
    return Cluster(nodes=nodes, inter_node_GBps=25.0)


def name_of(groups: tuple[tuple[str, int, int], ...]) -> str:
    """A cluster's name in the tables: "4x A100-80GB + 4x RTX-4090"."""
    return " + ".join(f"{n * c}x {g}" for g, n, c in groups)


def selected(only: list[str] | None) -> list[int]:
    """Indices of the cases `--only` keeps (all without it)."""
    return [
        i
        for i, (groups, _, _) in enumerate(CASES)
        if not only or any(o == str(i) if o.isdigit() else o in name_of(groups) for o in only)
    ]


def pipelines(problem: Problem, p) -> str:
    """A plan in one line per pipeline: its devices' GPU types in order (runs of one type as
    `3xT4`), schedule and micro-batch size x count, alike pipelines counted."""
    seen: dict[str, int] = {}
    for pipe in p.pipelines:
        names = [problem.cluster.gpu(d).name for d in pipe.devices]
        runs = [f"{len(list(g))}x{k}" for k, g in itertools.groupby(names)]
        line = (
            f"{' '.join(runs)} {pipe.schedule or p.train.schedule} "
            f"mbs {pipe.micro_batch_size} x {pipe.num_micro_batches}"
        )
        seen[line] = seen.get(line, 0) + 1
    return "\n".join(f"    {n} of: {line}" for line, n in seen.items())


def run_case(groups, model: str, batch: int, show: bool = False) -> dict:
    """Default search, hpp's exact path and the exact reference on fresh problems (no shared
    caches)."""
    spec = load_model(model, SEQ)

    def problem() -> Problem:
        return Problem(spec, cluster(groups), TrainSpec(global_batch=batch, seq_len=SEQ))

    row = {"cluster": name_of(groups), "model": model}
    row["batch"] = batch
    default = search.EXACT_STATES, search.EXACT_TEMPLATES
    runs = {
        "default": lambda: plan(problem()),
        "path": lambda: plan(problem()),
        "exact": lambda: search_exact(problem()),
    }
    for name, run in runs.items():
        if name == "path":
            search.EXACT_STATES, search.EXACT_TEMPLATES = 10**9, 10**9
        try:
            t0 = time.perf_counter()
            r = run()
            row[name] = (r.iteration_time_s, time.perf_counter() - t0)
            if show and name != "path":
                print(f"  {name} {r.iteration_time_s:.5f} s:\n{pipelines(problem(), r.plan)}")
        finally:
            search.EXACT_STATES, search.EXACT_TEMPLATES = default
    row["gap"] = row["default"][0] / row["exact"][0] - 1
    return row


def _default_cpu(i: int) -> None:
    """Child process: the default search on case i, its CPU seconds and step as JSON."""
    groups, model, batch = CASES[i]
    problem = Problem(
        load_model(model, SEQ), cluster(groups), TrainSpec(global_batch=batch, seq_len=SEQ)
    )
    c0 = time.process_time()
    r = plan(problem)
    print(json.dumps({"cpu_s": time.process_time() - c0, "step_s": r.iteration_time_s}))


def cpu_against(ref: str, repeat: int, cases: list[int]) -> None:
    """Per cluster, the default search's median CPU seconds here and at `ref`, side by side."""
    from search_speed import unpack

    here = Path(__file__).parent
    variants = {"old": unpack(ref), "new": here.parent / "src"}
    total = dict.fromkeys(variants, 0.0)
    print(f"{'cluster':>40} {'model':>10} old CPU s  new CPU s  new/old  old step  new step")
    for i in cases:
        groups, model, _ = CASES[i]
        cpus: dict[str, list[float]] = {k: [] for k in variants}
        steps: dict[str, float] = {}
        for _ in range(repeat):
            for name, src in variants.items():
                code = (
                    f"import sys; sys.path.insert(0, {str(here)!r}); import search_quality as q; "
                )
                out = subprocess.run(
                    [sys.executable, "-c", code + f"q._default_cpu({i})"],
                    env={**os.environ, "PYTHONPATH": str(src)},
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                got = json.loads(out.strip().splitlines()[-1])
                cpus[name].append(got["cpu_s"])
                steps[name] = got["step_s"]
        med = {k: statistics.median(v) for k, v in cpus.items()}
        for k in variants:
            total[k] += med[k]
        name = name_of(groups)
        print(
            f"{name:>40} {model:>10} {med['old']:9.2f} {med['new']:10.2f} "
            f"{med['new'] / med['old']:8.2f} {steps['old']:9.4f} {steps['new']:9.4f}",
            flush=True,
        )
    print(
        f"{'total':>40} {'':>10} {total['old']:9.2f} {total['new']:10.2f} "
        f"{total['new'] / total['old']:8.2f}"
    )


def markdown(rows: list[dict], command: str) -> str:
    worst = max(r["gap"] for r in rows)
    lines = [
        "## Default search against the exact reference",
        "",
        f"Measured with `{command}` ({len(rows)} clusters, seq {SEQ}). *Gap*: the default "
        "search's iteration time over the exact reference's, minus one (positive: default "
        f"slower). Largest gap: {worst:+.2%}. *Exact path*: hpp's exact path on every cluster "
        "(the reference of earlier tables).",
        "",
        "| cluster | model | batch | default step | exact path step | exact step | gap "
        "| default search | exact path search | exact search |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cluster']} | {r['model']} | {r['batch']} | {r['default'][0]:.4f} s | "
            f"{r['path'][0]:.4f} s | {r['exact'][0]:.4f} s | {r['gap']:+.2%} | "
            f"{r['default'][1]:.2f} s | {r['path'][1]:.2f} s | {r['exact'][1]:.2f} s |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the Markdown table here")
    ap.add_argument("--cpu-against", help="git commit whose default search to time beside this")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--only", action="append", help="keep clusters whose name contains this (or index)"
    )
    ap.add_argument("--plans", action="store_true", help="print the two plans per cluster")
    args = ap.parse_args(argv)
    cases = selected(args.only)
    if args.cpu_against:
        cpu_against(args.cpu_against, args.repeat, cases)
        return 0
    rows = []
    t0, c0 = time.perf_counter(), time.process_time()
    for i in cases:
        groups, model, batch = CASES[i]
        rows.append(run_case(groups, model, batch, args.plans))
        r = rows[-1]
        print(
            f"{r['cluster']:>40} {model:>10} B={batch:<4} default {r['default'][0]:.4f} s "
            f"({r['default'][1]:.2f} s) path {r['path'][0]:.4f} s ({r['path'][1]:.2f} s) "
            f"exact {r['exact'][0]:.4f} s ({r['exact'][1]:.2f} s) "
            f"gap {r['gap']:+.2%}",
            flush=True,
        )
    print(f"largest gap {max(r['gap'] for r in rows):+.2%}")
    print(f"whole run: {time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0:.0f} s CPU")
    if args.out:
        command = "python bench/search_quality.py " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        Path(args.out).write_text(markdown(rows, command.strip()))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
