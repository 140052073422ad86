"""What letting the planner pick multi-chunk schedules costs in search time, in CPU seconds.

    .venv/bin/python bench/schedule_search.py [--repeat 2] [SCENARIO.yaml:MODEL:BATCH ...]

Per scenario: hpp's search with one-chunk schedules only and with every multi-chunk schedule in
the registry, alternated `--repeat` times; it prints the median CPU seconds of the search
(`time.process_time`, which the shared machine's load does not inflate as it does wall-clock
time), their ratio, and each plan's fraction of the physical limit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

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
CHUNKED = tuple(n for n, s in SCHEDULES.items() if s.placement != "one")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*", default=DEFAULT, metavar="FILE:MODEL:BATCH")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    print("| scenario | one-chunk CPU s | with schedules CPU s | ratio | % of limit | schedules |")
    print("|---|---|---|---|---|---|")
    for item in args.scenarios:
        name, model, batch = item.split(":")
        cluster = load_cluster(HERE / "scenarios" / name)
        spec = load_model(model, 2048)
        train = TrainSpec(global_batch=int(batch), seq_len=2048)
        cpu: dict[tuple, list[float]] = {(): [], CHUNKED: []}
        got = {}
        for _ in range(args.repeat):
            for schedules in cpu:
                problem = Problem(spec, cluster, train, schedules=schedules)
                t0 = time.process_time()
                got[schedules] = plan(problem, "hpp")
                cpu[schedules].append(time.process_time() - t0)
        limit = physical_limit_samples_per_s(Problem(spec, cluster, train))
        one, many = (statistics.median(cpu[k]) for k in cpu)
        frac = "/".join(f"{got[k].throughput_samples_per_s / limit:.0%}" for k in cpu)
        print(
            f"| {cluster.name} {model} B={batch} | {one:.2f} | {many:.2f} | {many / one:.2f}x | "
            f"{frac} | {schedule_summary(got[CHUNKED].plan)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
