"""Planner benchmark: every strategy on a suite of heterogeneous clusters and models.

    .venv/bin/python bench/planner.py [--quick] [--only CLUSTER[:MODEL] ...]
        [--out docs/benchmarks-planner.md]

The suite (`bench/scenarios/suite.yaml`) lists cluster files and a global batch for each; every
cluster runs every model. Per scenario it prints each strategy's throughput, hpp's speed-up over
each baseline, every search time, and hpp's throughput as a fraction of the physical limit
(every device training the whole model alone at its own speed, from the same layer costs: no
bubbles, no communication, memory ignored). Every strategy plans on a fresh problem, so no search
profits from another's caches. `--quick` runs the scenarios marked quick with one model (the
smoke test's mode); `--only` the scenarios named (a subset while working). `--out` writes
the results as Markdown with the command that made them.
`--sharding` lets every strategy shard the optimizer state (`Problem.sharding_mode`; default
targeted, `hetpp plan`'s: the schedule pass again under ZeRO-1 where that is 1% faster).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import yaml

from hetpp.cost.comm import allreduce_time_s, group_link
from hetpp.cost.step import cost_model_for_plan
from hetpp.planner import BASELINES, Problem, physical_limit_samples_per_s, plan
from hetpp.planner.oracle import MAX_DEVICES
from hetpp.planner.schedules import busiest_work_s
from hetpp.report.plans import schedule_summary
from hetpp.specs import TrainSpec, load_cluster, load_model
from hetpp.specs.schedule import SCHEDULES

HERE = Path(__file__).parent
NOTES = "## Reading the results"


def scenarios(quick: bool) -> list[tuple[Path, str, int, int]]:
    """(cluster file, model, global batch, seq len) for every scenario of the suite."""
    suite = yaml.safe_load((HERE / "scenarios" / "suite.yaml").read_text())
    models = suite["models"][:1] if quick else suite["models"]
    out = []
    for s in suite["scenarios"]:
        if quick and not s.get("quick"):
            continue
        for m in models:
            out.append((HERE / "scenarios" / s["cluster"], m, s["global_batch"], suite["seq_len"]))
    return out


def _chosen(scenario: tuple[Path, str, int, int], only: list[str] | None) -> bool:
    """Whether `--only` keeps this (cluster file, model, ...) scenario (None: every one)."""
    cluster, model = scenario[0].stem, scenario[1]
    return only is None or cluster in only or f"{cluster}:{model}" in only


def run_one(
    cluster_file: Path,
    model: str,
    batch: int,
    seq: int,
    oracle: bool,
    schedules: tuple[str, ...] | None = None,
    sharding: str = "targeted",
) -> dict:
    cluster = load_cluster(cluster_file)
    spec = load_model(model, seq)

    def problem() -> Problem:
        train = TrainSpec(global_batch=batch, seq_len=seq)
        return Problem(spec, cluster, train, schedules=schedules, sharding_mode=sharding)

    row = {
        "cluster": cluster.name,
        "gpus": cluster.num_devices,
        "types": len({d.gpu.name for d in cluster.devices}),
        "model": model,
        "batch": batch,
        "limit": physical_limit_samples_per_s(problem()),
    }
    names = [*BASELINES, "hpp"] + (
        ["oracle"] if oracle and cluster.num_devices <= MAX_DEVICES else []
    )
    results = {}
    for name in names:
        t0 = time.perf_counter()
        r = results[name] = plan(problem(), name)
        row[name] = {
            "tput": r.throughput_samples_per_s,
            "search": time.perf_counter() - t0,
            "pipelines": len(r.plan.pipelines) if r.plan else 0,
            "devices": r.plan.num_devices if r.plan else 0,
            "origin": r.note.split(" plan was")[0].removeprefix("the ") if r.note else "hpp",
            "setting": _setting(r.plan) if r.plan else "",
            "sync_share": _sync_share(r) if r.plan else 0.0,
        }
    r = results["hpp"]
    row["hpp"]["breakdown"] = step_breakdown(problem(), r, row["limit"]) if r.plan else {}
    return row


LOSSES = ("bubble", "sync", "optimizer", "efficiency", "unused", "imbalance")
"""What takes a step's time beyond the physical limit's, as `step_breakdown` splits it."""


def step_breakdown(problem: Problem, result, limit: float) -> dict[str, float]:
    """hpp's step split into shares of its time that add up to 1: `limit`, the step at the
    physical limit's rate (so also the fraction of the limit reached); `bubble`, the slowest
    pipeline's time beyond its micro-batches x its busiest device's work per micro-batch (fill,
    drain and lock-step stalls); `sync`, gradient sync exposed after the pipelines; `optimizer`,
    the rest of the step after them (optimizer step, sharded all-gathers); `efficiency`, what
    the plan's micro-batch sizes and recomputation cost against the limit's best setting, on the
    devices the plan uses; `unused`, the devices the plan leaves idle (the limit of the devices
    it uses against the whole cluster's); `imbalance`, the remainder: that busiest device's work
    over the plan's devices' mean (stage and batch imbalance, hops inside a beat)."""
    plan, step = result.plan, result.step
    total = step.iteration_time_s
    cm = problem.cost_model(plan.train.recompute)
    times = step.pipeline_time_s
    slowest = max(range(len(times)), key=times.__getitem__)
    busy = plan.pipelines[slowest].num_micro_batches * busiest_work_s(step)[slowest]
    rate = 0.0  # samples/s of the plan's devices at its settings, each training the model alone
    for pipe in plan.pipelines:
        mbs = pipe.micro_batch_size
        for st in {st.device: st for st in pipe.stages}.values():
            c = cm.layer_costs(cm.cluster.gpu(st.device), mbs, st.recomputes(plan.train), st.tp)
            rate += mbs / (c.fwd_cum[-1] + c.bwd_cum[-1])
    used = {st.device for pipe in plan.pipelines for st in pipe.stages}
    ideal, at_setting = plan.global_batch / limit, plan.global_batch / rate
    ideal_used = plan.global_batch / physical_limit_samples_per_s(problem, used)
    tail = total - max(times)
    sync = min(step.exposed_sync_s, tail)
    seconds = {
        "limit": ideal,
        "bubble": max(times) - busy,
        "sync": sync,
        "optimizer": tail - sync,
        "efficiency": at_setting - ideal_used,
        "unused": ideal_used - ideal,
        "imbalance": busy - at_setting,
    }
    return {k: v / total for k, v in seconds.items()}


def _sync_share(result) -> float:
    """Gradient sync over the slowest link alone, as a share of the step: the whole model's
    gradient all-reduced once over the plan's pipelines on the slowest link any of its buckets
    crosses (what no schedule can hide when it exceeds the compute)."""
    plan, step = result.plan, result.step
    cm = cost_model_for_plan(plan)
    nbytes = cm.model.total_params * plan.train.grad_bytes_per_param
    links = [group_link(cm.cluster, b.owners) for b in step.buckets if len(set(b.owners)) > 1]
    if not links:
        return 0.0
    slow = min(links, key=lambda link: link.bw_bytes_per_s)
    return allreduce_time_s(nbytes, len(plan.pipelines), slow) / step.iteration_time_s


def _setting(plan) -> str:
    """Schedule, micro-batch sizes and recomputation of a plan, as the table shows them."""
    sizes = sorted({p.micro_batch_size for p in plan.pipelines})
    rc = "recompute" if plan.train.recompute else "no recompute"
    shard = "" if plan.sharding == "none" else f", sharding {plan.sharding}"
    half = ", half blocks" if plan.model.layer_unit == "half" else ""
    return f"{schedule_summary(plan)}, mbs {'/'.join(map(str, sizes))}, {rc}{shard}{half}"


def speedups(row: dict) -> dict[str, float]:
    """hpp's throughput over each baseline's (inf where the baseline found no plan)."""
    h = row["hpp"]["tput"]
    return {b: (h / row[b]["tput"] if row[b]["tput"] > 0 else float("inf")) for b in BASELINES}


def _secs(v: float) -> str:
    return "(none run)" if v != v else f"{v:.2f} s"


def _x(v: float) -> str:
    return "no plan" if v == float("inf") else f"{v:.2f}x"


def print_row(row: dict) -> None:
    sp = speedups(row)
    h = row["hpp"]
    parts = [
        f"{b} {row[b]['tput']:.1f}/s ({sp[b]:.2f}x, {row[b]['search']:.2f}s)" for b in BASELINES
    ]
    line = (
        f"{row['cluster']:>13} {row['model']:>10} B={row['batch']:<5} hpp {h['tput']:.1f}/s "
        f"({h['search']:.2f}s, {h['tput'] / row['limit']:.0%} of limit) | " + " | ".join(parts)
    )
    if "oracle" in row:
        line += f" | oracle {row['oracle']['tput']:.1f}/s"
    print(line, flush=True)


def summary(rows: list[dict]) -> dict:
    best = [min(speedups(r).values()) for r in rows]
    frac = [r["hpp"]["tput"] / r["limit"] for r in rows]

    def search(n: int) -> list[float]:
        return [r["hpp"]["search"] for r in rows if r["gpus"] == n]

    return {
        "speedup_median": statistics.median(best),
        "speedup_max": max(best),
        "frac_median": statistics.median(frac),
        "frac_min": min(frac),
        "frac_max": max(frac),
        "search_64": max(search(64), default=float("nan")),
        "search_1024": max(search(1024), default=float("nan")),
        "oracle": [(r["hpp"]["tput"], r["oracle"]["tput"]) for r in rows if "oracle" in r],
    }


def markdown(rows: list[dict], s: dict, command: str) -> str:
    lines = [
        "# Planner benchmarks",
        "",
        "Every strategy plans the same model, batch and cluster with the same cost model; the "
        "throughput is the cost model's full step (pipelines, block-wise gradient sync, "
        "optimizer) for the plan each returns. *Limit* is the physical limit: every device "
        "training the whole model alone at its own speed (same layer costs; no bubbles, no "
        "communication, memory ignored). Speed-ups are hpp's throughput over the baseline's. "
        "Search times are wall-clock seconds of each strategy's whole search (hpp's includes "
        "running the three baselines, whose plans it keeps when they are best).",
        "",
        f"Measured on {platform.machine()} with {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, with:",
        "",
        "```",
        command,
        "```",
        "",
        "## Summary",
        "",
        f"- hpp over the best baseline: median {s['speedup_median']:.2f}x, "
        f"max {s['speedup_max']:.2f}x ({len(rows)} scenarios).",
        f"- hpp throughput as a fraction of the physical limit: median {s['frac_median']:.0%} "
        f"(min {s['frac_min']:.0%}, max {s['frac_max']:.0%}).",
        f"- hpp search time, slowest scenario: {_secs(s['search_64'])} at 64 GPUs, "
        f"{_secs(s['search_1024'])} at 1024 GPUs.",
    ]
    low = [r for r in rows if r["hpp"]["tput"] / r["limit"] < 0.6]
    if low:
        lines.append(
            "- below 60% of the limit (gradient sync of the whole model over the slowest link "
            "its buckets cross, alone, as a share of the step): "
            + "; ".join(
                f"{r['cluster']} {r['model']} {r['hpp']['tput'] / r['limit']:.0%} "
                f"(sync {r['hpp']['sync_share']:.0%})"
                for r in low
            )
            + "."
        )
    if s["oracle"]:
        ratios = [h / o - 1 for h, o in s["oracle"]]
        lines.append(
            f"- hpp against the exhaustive oracle (clusters of at most {MAX_DEVICES} GPUs; its "
            "space is one-chunk layouts at whole blocks, which hpp's last passes leave): hpp's "
            f"throughput {min(ratios):+.2%} to {max(ratios):+.2%} of the oracle's over "
            f"{len(s['oracle'])} scenarios."
        )
    lines += [
        "",
        "## Scenarios",
        "",
        "*hpp plan*: `own` when hpp's own search found the best plan, else the baseline whose "
        "plan it kept. *hpp setting*: the schedules its pipelines run (how many pipelines each, "
        "`/2`: two chunks per device; the one-chunk default is the suite's TrainSpec's), "
        "micro-batch size, recomputation, optimizer sharding, and *half blocks* where a stage "
        "ends between a block's attention and MLP (hpp's last pass). *no plan*: the baseline found "
        "nothing that fits.",
        "",
        "| cluster | GPUs | types | model | batch | hpp samples/s | % of limit | vs uniform "
        "| vs layer-bal. | vs data-bal. | hpp plan | hpp setting | hpp search "
        "| baseline searches (u/l/d) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sp = speedups(r)
        h = r["hpp"]
        lines.append(
            f"| {r['cluster']} | {r['gpus']} | {r['types']} | {r['model']} | {r['batch']} | "
            f"{h['tput']:.1f} | {h['tput'] / r['limit']:.0%} | {_x(sp['uniform'])} | "
            f"{_x(sp['layer-balanced'])} | {_x(sp['data-balanced'])} | "
            f"{'own' if h['origin'] == 'hpp' else h['origin']} | {h['setting']} | "
            f"{h['search']:.2f} s | "
            + "/".join(f"{r[b]['search']:.2f}" for b in BASELINES)
            + " s |"
        )
    lines += [
        "",
        "## Where the step goes",
        "",
        "hpp's step as shares of its time (`step_breakdown`; they add up to 100%): *at limit*, "
        "the step at the physical limit's rate (the fraction of the limit reached); *bubble*, "
        "the slowest pipeline beyond its micro-batches x its busiest device's work (fill, "
        "drain, stalls); *sync*, gradient sync exposed after the pipelines; *optimizer*, the "
        "rest after them; *mbs/recompute*, the plan's micro-batch sizes and recomputation "
        "against the limit's best setting on the devices it uses; *unused*, the devices it "
        "leaves idle (the limit on the devices it uses against the cluster's); *imbalance*, the "
        "remainder (the busiest device's work over the mean: stage and batch imbalance). "
        "*sync alone*: the whole model's gradient all-reduced once over the slowest link its "
        "buckets cross, as a share of the step (what no schedule hides once above 25%).",
        "",
        "| cluster | model | at limit | bubble | sync | optimizer | mbs/recompute | unused "
        "| imbalance | sync alone | hpp setting |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b = r["hpp"]["breakdown"]
        lines.append(
            f"| {r['cluster']} | {r['model']} | "
            + " | ".join(f"{b.get(k, 0.0):.0%}" for k in ("limit", *LOSSES))
            + f" | {r['hpp']['sync_share']:.0%} | {r['hpp']['setting']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the quick scenarios, one model")
    ap.add_argument("--out", help="write Markdown results here")
    ap.add_argument("--no-oracle", action="store_true", help="skip the oracle on small clusters")
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="CLUSTER[:MODEL]",
        help="run only these scenarios: a cluster file's name without .yaml (gen-16), or one "
        "of its models (gen-16:llama2-7b)",
    )
    ap.add_argument(
        "--schedules",
        nargs="*",
        metavar="NAME",
        help="multi-chunk schedules the strategies may give pipelines (default: every one in "
        "the registry; none: 1F1B only)",
    )
    ap.add_argument(
        "--sharding",
        choices=("none", "optimizer", "auto", "targeted"),
        default="targeted",
        help="optimizer sharding every strategy may use (default targeted, hetpp plan's)",
    )
    args = ap.parse_args(argv)
    chunked = tuple(n for n, s in SCHEDULES.items() if s.multi_stage)
    schedules = chunked if args.schedules is None else tuple(args.schedules)
    chosen = [x for x in scenarios(args.quick) if _chosen(x, args.only)]
    if not chosen:
        ap.error(f"--only {' '.join(args.only)}: no scenario of the suite matches")
    rows = []
    for cluster_file, model, batch, seq in chosen:
        oracle = not args.no_oracle
        rows.append(run_one(cluster_file, model, batch, seq, oracle, schedules, args.sharding))
        print_row(rows[-1])
    s = summary(rows)
    print(
        f"hpp over the best baseline: median {s['speedup_median']:.2f}x, max "
        f"{s['speedup_max']:.2f}x; fraction of the physical limit: median "
        f"{s['frac_median']:.0%}; slowest hpp search: {_secs(s['search_64'])} at 64 GPUs, "
        f"{_secs(s['search_1024'])} at 1024 GPUs"
    )
    if args.out:
        command = ".venv/bin/python bench/planner.py " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        out = Path(args.out)
        # Hand-written notes after NOTES survive a rerun.
        notes = out.read_text().partition(NOTES)[2] if out.exists() else ""
        out.write_text(markdown(rows, s, command.strip()) + (f"\n{NOTES}{notes}" if notes else ""))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
