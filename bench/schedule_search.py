"""What letting the planner pick multi-chunk schedules costs in search time, in CPU seconds.

    .venv/bin/python bench/schedule_search.py [--repeat 2] [--against REF] [FILE:MODEL:BATCH ...]

Per scenario: hpp's search with one-chunk schedules only and with every multi-chunk schedule in
the registry, alternated `--repeat` times; it prints the median CPU seconds of the search
(`time.process_time`, which the shared machine's load does not inflate as it does wall-clock
time), their ratio, and each plan's fraction of the physical limit. `--against REF` also times
the search with schedules as `src/` was at git commit REF (unpacked as `bench/search_speed.py`
does), each search of either tree in a fresh subprocess, the trees alternating, and prints the
new/REF ratio of the CPU medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from search_speed import child_json, unpack

from hetpp.planner import Problem, physical_limit_samples_per_s, plan
from hetpp.report.plans import schedule_summary
from hetpp.specs import TrainSpec, load_cluster, load_model
from hetpp.specs.schedule import SCHEDULES

HERE = Path(__file__).parent
DEFAULT = [
    "mixed-8.yaml:gpt3-1.3b:64",
    "edu-32.yaml:gpt3-1.3b:128",
    "lab-64.yaml:gpt3-1.3b:256",
    "dc-128.yaml:llama2-7b:512",
    "mega-1024.yaml:gpt3-13b:4096",
]
CHUNKED = tuple(n for n, s in SCHEDULES.items() if s.multi_stage)


def _problem(item: str, schedules: tuple[str, ...]) -> Problem:
    name, model, batch = item.split(":")
    train = TrainSpec(global_batch=int(batch), seq_len=2048)
    return Problem(load_model(model, 2048), load_cluster(HERE / "scenarios" / name), train,
                   schedules=schedules)  # fmt: skip


def _one(item: str) -> None:
    """Child process: hpp's search with every multi-chunk schedule, its CPU seconds and
    throughput as JSON on stdout."""
    problem = _problem(item, CHUNKED)
    t0 = time.process_time()
    r = plan(problem, "hpp")
    print(json.dumps({"cpu_s": time.process_time() - t0, "tput": r.throughput_samples_per_s}))


def _in_subprocess(item: str, src: Path) -> tuple[float, float]:
    """(CPU seconds, samples/s) of `_one` with the package under `src`."""
    got = child_json("schedule_search", f"_one({item!r})", src)
    return got["cpu_s"], got["tput"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*", default=DEFAULT, metavar="FILE:MODEL:BATCH")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--against", metavar="REF", help="git commit whose src/ to time alongside")
    args = ap.parse_args()
    trees = {"new": HERE.parent / "src", "ref": unpack(args.against)} if args.against else {}
    head = "| scenario | one-chunk CPU s | with schedules CPU s | ratio | % of limit | schedules |"
    rule = "|---|---|---|---|---|---|"
    if trees:
        head += f" {args.against} with schedules CPU s | new/{args.against} | {args.against} % |"
        rule += "---|---|---|"
    print(head)
    print(rule)
    for item in args.scenarios:
        cpu: dict[tuple, list[float]] = {(): [], CHUNKED: []}
        side: dict[str, list[float]] = {k: [] for k in trees}
        got, tput = {}, {}
        for _ in range(args.repeat):
            for schedules in cpu:
                problem = _problem(item, schedules)
                t0 = time.process_time()
                got[schedules] = plan(problem, "hpp")
                cpu[schedules].append(time.process_time() - t0)
            for k, src in trees.items():
                c, tput[k] = _in_subprocess(item, src)
                side[k].append(c)
        problem = _problem(item, ())
        limit = physical_limit_samples_per_s(problem)
        one, many = (statistics.median(cpu[k]) for k in cpu)
        frac = "/".join(f"{got[k].throughput_samples_per_s / limit:.0%}" for k in cpu)
        line = (
            f"| {problem.cluster.name} {item.split(':')[1]} B={problem.train.global_batch} | "
            f"{one:.2f} | {many:.2f} | {many / one:.2f}x | {frac} | "
            f"{schedule_summary(got[CHUNKED].plan)} |"
        )
        if trees:
            new, ref = (statistics.median(side[k]) for k in ("new", "ref"))
            line += f" {ref:.2f} | {new / ref:.2f}x | {tput['ref'] / limit:.0%} |"
        print(line, flush=True)


if __name__ == "__main__":
    main()
