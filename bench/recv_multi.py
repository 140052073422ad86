"""Receive buffers of the multi-stage schedules: live in torch's lowered IR, against the bound
(issue 13).

Counts: torch's lowered schedule (`pipeline_order_with_comms`, built here without a process
group; lowered as torch lowers it, and with its `defer_pp_recv`); each buffer is live from its
RECV action to its micro-batch's full backward or W on that stage (the rule of
`hetpp.runtime.recv_buffers`), counted at the stage's peak of live buffers. `--write-table`
writes them, for pipelines of up to 8 devices at 2 chunks, to the table the cost model reads
(`hetpp/data/recv_buffers.json`).

Scenarios: hpp's plan, then every multi-chunk schedule trial with all shapes moved
(`planner.schedules._all_chunked`, the pass's own); for the fastest trial, each device's memory
parts, its receive buffers as the cost model charges them now (live) and at the former bound
(one per micro-batch and direction, of the live buffers' size: a stage's input and output are
both the hidden state).

    .venv/bin/python bench/recv_multi.py
    .venv/bin/python bench/recv_multi.py --write-table
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
import yaml
from torch.distributed import pipelining
from torch.distributed.pipelining._utils import generate_rank_to_stage_mapping

from hetpp.cost.memory import TABLE_CHUNKS, recv_buffer_counts
from hetpp.planner import Problem, physical_limit_samples_per_s, plan
from hetpp.planner.assemble import evaluate
from hetpp.planner.schedules import CHUNK_COUNTS, _all_chunked, _shape
from hetpp.specs import TrainSpec, load_cluster, load_model
from hetpp.specs.schedule import SCHEDULES

HERE = Path(__file__).parent
SCENARIOS = [
    ("gen-16", "llama2-7b", 64),
    ("lab-64", "llama2-7b", 256),
    ("cloud-64", "gpt3-13b", 256),
]
GB = 1e9
TABLE = HERE.parent / "src" / "hetpp" / "data" / "recv_buffers.json"
TABLE_MAX_DEVICES = 8
"""Pipelines of up to this many devices have their counts in the table (deeper: the bound)."""
TABLE_CHECKED_M = 16
"""Micro-batches past the last change of any count for which the table's rows were checked."""
SEQ = yaml.safe_load((HERE / "scenarios" / "suite.yaml").read_text())["seq_len"]


class _PlacedStage:
    """What a PipelineScheduleMulti reads from its stages at construction."""

    def __init__(self, index: int, num_stages: int, num_ranks: int):
        self.stage_index, self.num_stages = index, num_stages
        self.group_size, self.group_rank = num_ranks, 0
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.submod = torch.nn.Identity()


def live_counts(
    name: str, num_ranks: int, chunks: int, m: int, defer: bool = False
) -> tuple[tuple[int, int], ...]:
    """Per stage: (activation, gradient) receive buffers live at the stage's peak of live
    buffers in torch's lowered IR (the most activations among peaks of equal size). `defer`:
    with torch's `defer_pp_recv`, which posts each receive as late as it may."""
    spec, num_stages = SCHEDULES[name], num_ranks * chunks
    style = "v" if spec.placement == "v" else "loop"
    mine = generate_rank_to_stage_mapping(num_ranks, num_stages, style)[0]
    sched = getattr(pipelining, spec.torch_class)(
        [_PlacedStage(i, num_stages, num_ranks) for i in mine], m, defer_pp_recv=defer
    )
    peak = [(0, 0)] * num_stages
    for actions in sched.pipeline_order_with_comms.values():
        live: dict[int, set] = defaultdict(set)
        for a in actions:
            for x in a.sub_actions or (a,):
                kind, s, i = x.computation_type.name, x.stage_index, x.microbatch_index
                if kind in ("RECV_F", "RECV_B"):
                    live[s].add((kind, i))
                elif kind in ("FULL_BACKWARD", "BACKWARD_WEIGHT"):
                    live[s] -= {("RECV_F", i), ("RECV_B", i)}
                else:
                    continue
                acts = sum(k == "RECV_F" for k, _ in live[s])
                now = (acts, len(live[s]) - acts)
                if (sum(now), now[0]) > (sum(peak[s]), peak[s][0]):
                    peak[s] = now
    return tuple(peak)


def live_buffers(name: str, num_ranks: int, chunks: int, m: int, defer: bool = False) -> list:
    """Stage -> receive buffers live at its peak (both directions)."""
    return [sum(c) for c in live_counts(name, num_ranks, chunks, m, defer)]


def table_entry(name: str, num_ranks: int) -> dict:
    """`live_counts` at the table's chunks (`TABLE_CHUNKS`) for every m torch runs, up to
    `TABLE_CHECKED_M` micro-batches past the last m where a count changes; stored up to that
    last change (beyond it every m counts the same)."""
    spec, rows = SCHEDULES[name], {}
    chunks = TABLE_CHUNKS[spec.placement]
    m, last_change, prev = 0, 0, None
    while (
        m < max(num_ranks * num_ranks, 4 * num_ranks) + TABLE_CHECKED_M
        or m < last_change + TABLE_CHECKED_M
    ):
        m += 1
        if spec.micro_batch_problem(chunks * num_ranks, num_ranks, m) is not None:
            continue
        rows[m] = live_counts(name, num_ranks, chunks, m)
        if rows[m] != prev:
            last_change, prev = m, rows[m]
    return {str(k): [list(c) for c in v] for k, v in rows.items() if k <= last_change}


def write_table(path: Path) -> None:
    """The table `hetpp.cost.memory.recv_buffer_counts` reads."""
    table = {
        name: {str(d): table_entry(name, d) for d in range(1, TABLE_MAX_DEVICES + 1)}
        for name, spec in SCHEDULES.items()
        if spec.multi_stage
    }
    path.write_text(json.dumps(table, separators=(",", ":")) + "\n")


def print_counts() -> None:
    """Per multi-stage schedule at its table's chunks: each stage's live buffers, as lowered
    and deferred, against the 2m (m on the first and last stage) charged today."""
    print("| schedule | devices | m | live per stage (lowered) | deferred | charged |")
    for name, spec in SCHEDULES.items():
        for d in (2, 4):
            for m in (4, 8, 16):
                c = TABLE_CHUNKS[spec.placement]
                if not spec.multi_stage or spec.micro_batch_problem(c * d, d, m):
                    continue
                live, late = live_buffers(name, d, c, m), live_buffers(name, d, c, m, True)
                row = [" ".join(str(x[s]) for s in range(c * d)) for x in (live, late)]
                charged = " ".join(str(m * ((s > 0) + (s < c * d - 1))) for s in range(c * d))
                print(f"| {name} | {d} | {m} | {row[0]} | {row[1]} | {charged} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-table", action="store_true", help=f"write {TABLE.name}")
    if parser.parse_args(argv).write_table:
        write_table(TABLE)
        return 0
    print_counts()
    for cluster_name, model, batch in SCENARIOS:
        cluster = load_cluster(HERE / "scenarios" / f"{cluster_name}.yaml")
        problem = Problem(
            load_model(model, SEQ), cluster, TrainSpec(global_batch=batch, seq_len=SEQ)
        )
        result = plan(problem, "hpp")
        base = result.plan
        groups: dict[tuple, list[int]] = {}
        for i, pipe in enumerate(base.pipelines):
            if pipe.chunks == 1:
                groups.setdefault(_shape(problem, pipe), []).append(i)
        trials = []
        for name in problem.chunked_schedules:
            for chunks in CHUNK_COUNTS[SCHEDULES[name].placement]:
                trial = _all_chunked(problem, base, groups, SCHEDULES[name], chunks, "balanced")
                if trial is not None:
                    trials.append((evaluate(problem, trial).iteration_time_s, name, trial))
        t, name, trial = min(trials, key=lambda x: x[0])
        cost = evaluate(problem, trial)
        base_s = evaluate(problem, base).iteration_time_s
        print(f"## {cluster_name} {model}: best trial {name} {t:.3f} s (hpp {base_s:.3f} s)")
        picked = ", ".join(sorted({p.schedule_in(problem.train).name for p in base.pipelines}))
        share = result.throughput_samples_per_s / physical_limit_samples_per_s(problem)
        print(f"hpp picks {picked}: {share:.1%} of the physical limit")
        per_dev = defaultdict(list)
        for st in cost.stages:
            per_dev[st.device].append(st)
        rows = []
        for dev, sts in per_dev.items():
            pipe = trial.pipelines[sts[0].pipeline]
            num, d, m = len(pipe.stages), len(pipe.devices), pipe.num_micro_batches
            spec = pipe.schedule_in(problem.train)
            tot = sum(s.memory.total for s in sts) - (len(sts) - 1) * sts[0].memory.reserve
            live = sum(s.memory.recv_buffers for s in sts)
            bound = 0.0
            for s in sts:  # one buffer per micro-batch and direction, of the live ones' size
                k = spec.in_flight(s.stage, num, m, d)
                count = sum(recv_buffer_counts(spec, k, m, s.stage, num, d))
                dirs = (s.stage > 0) + (s.stage < num - 1)
                bound += s.memory.recv_buffers / count * m * dirs if count else 0.0
            rows.append((dev, sts, m, tot - live + bound, bound, live, tot, sts[0].capacity_bytes))
        over_bound = sum(r[3] > r[7] for r in rows)
        over_live = sum(r[6] > r[7] for r in rows)
        print(f"devices over: {over_bound}/{len(rows)} at the bound, {over_live} at live counts")
        print(
            "| device | gpu | m | states | activations | transient | recv bound | recv live "
            "| total / cap, bound | live |"
        )
        rows.sort(key=lambda r: -r[3] / r[7])
        for dev, sts, m, tot_bound, bound, live, tot, cap in rows[:4]:
            states = sum(s.memory.weights + s.memory.grads + s.memory.optimizer for s in sts)
            acts = sum(s.memory.activations for s in sts)
            tr = sum(s.memory.transient for s in sts)
            parts = " | ".join(f"{v / GB:.2f}" for v in (states, acts, tr, bound, live))
            ratios = f"{tot_bound / cap:.3f} | {tot / cap:.3f}"
            print(f"| {dev} | {sts[0].gpu} | {m} | {parts} | {ratios} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
