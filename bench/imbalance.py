"""What the *imbalance* share of `bench/planner.py`'s step breakdown is made of, per plan.

    .venv/bin/python bench/imbalance.py --only CLUSTER:MODEL [...] [--plans DIR]

The breakdown's *imbalance* is the slowest pipeline's micro-batches x its busiest device's work,
less the step the plan's devices would take each training the model alone at the plan's settings
(`step_breakdown`). With R the devices' summed rate (samples/s), r_p pipeline p's (its devices'
rates at its micro-batch size), T the slowest pipeline's time and T_p each one's, the identity

    T = B/R + sum_p r_p/R (T - T_p) + sum_p r_p/R bubble_p + sum_p B_p/R (sigma_p - 1)

(B_p a pipeline's samples, bubble_p its time beyond its micro-batches x its busiest device's
work, sigma_p that busiest work over its devices' balanced work 1 / sum_d 1/c_d, c_d a device's
time for the whole model per micro-batch) splits it exactly into three parts:

- *batch*: pipelines that finish before the slowest one (batch shares rounded to micro-batches);
- *other bubbles*: the rate-weighted bubble of every pipeline less the slowest one's (the
  breakdown's *bubble* column counts the slowest pipeline's only);
- *stage*: stage imbalance, sum_p B_p/R (sigma_p - 1), split per pipeline into
  *granularity* (the best whole-block counts per device, embedding and head costing nothing,
  against the blocks' balanced work), *head/embedding* (the same counts with the embedding and
  head on the devices that hold them, against the whole model's balanced work, less
  granularity), *memory* (one-chunk pipelines: the stage DP with memory against without, same
  devices, order and settings) and *split* (the plan's split against the best one: the schedule
  pass's re-split rules, a baseline's equal layers, the 1F1B window rule).

Each pipeline also gets *halves*: the granularity term were attention and MLP separate split
points (`half_block_counts`; an estimate for a runtime that does not exist, costed by the
sublayers' forward FLOPs).

On a plan at half blocks (`ModelConfig.layer_unit` half) *granularity* and *head/embedding*
still count whole blocks, so *split* goes negative by what the half cuts gain over them;
*halves* is the bound such a plan is measured against.

Shares are of the whole step, as in the breakdown. `--plans DIR` keeps each hpp plan as JSON and
reads it back on the next run (the search is the slow part).
"""

from __future__ import annotations

import argparse
import heapq
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np
from planner import _chosen, scenarios, step_breakdown

from hetpp.cost.step import cost_model_for_plan, step_cost
from hetpp.planner import Problem, physical_limit_samples_per_s, plan
from hetpp.planner.partition import balance_stages, in_flight_per_stage, stage_tables
from hetpp.planner.schedules import busiest_work_s
from hetpp.specs import TrainSpec, load_cluster, load_model
from hetpp.specs.model import BLOCK_KINDS, ModelConfig
from hetpp.specs.plan import Plan


def best_counts(block_s: list[float], extra_s: list[float], blocks: int) -> float:
    """Least possible busiest work when `blocks` identical blocks go to devices of per-block
    seconds `block_s` already holding `extra_s`: each block to the device that ends it first
    (optimal for identical jobs on machines of different speeds)."""
    heap = [(e + b, b, e) for b, e in zip(block_s, extra_s)]
    heapq.heapify(heap)
    for _ in range(blocks):
        end, b, _ = heapq.heappop(heap)
        heapq.heappush(heap, (end + b, b, end))
    return max(max(extra_s), max(e for _, _, e in heap))


def attention_share(config: ModelConfig, seq_len: int) -> float:
    """A block's attention part (norm-free: QKV and output projections, scores and AV) as a
    share of its forward FLOPs (the `_block` cost of `specs.model`); the rest is the MLP."""
    h, f, q = config.hidden_size, config.ffn_hidden_size, config.q_dim
    kvd = config.kv_heads * config.head_dim
    attn = 2.0 * (h * (q + 2 * kvd) + q * h) + 4 * seq_len * q
    mlp = 2.0 * (3 if config.gated else 2) * h * f
    return attn / (attn + mlp)


def half_block_counts(block_s: list[float], blocks: int, attn: float) -> float:
    """Least busiest work when the `blocks` blocks (per-block seconds `block_s` per device) may
    also be cut between attention (share `attn` of a block) and MLP, device order ignored as in
    `best_counts`. A contiguous stage holds n whole blocks, plus an attention part where it ends
    mid-block, or an MLP part where it starts there; both kinds come in equal numbers k, and
    sum n + k = blocks. Bisection over the candidate loads; a DP over devices on (k_attn,
    k_mlp) gives the most whole blocks at a load."""
    parts = (0.0, attn, 1.0 - attn)
    loads = sorted({(n + e) * b for b in block_s for e in parts for n in range(blocks + 1)})
    k_max = len(block_s)

    def fits(t: float) -> bool:
        best = np.full((k_max + 1, k_max + 1), -1, dtype=np.int64)
        best[0, 0] = 0
        for b in block_s:
            new = best.copy()  # extra 0
            for e, (da, dm) in zip(parts[1:], ((1, 0), (0, 1))):
                n = int(np.floor((t - e * b) / b + 1e-12))
                if n < 0:
                    continue
                shifted = np.full_like(best, -1)
                shifted[da:, dm:] = best[: k_max + 1 - da, : k_max + 1 - dm]
                new = np.maximum(new, np.where(shifted >= 0, shifted + n, -1))
            n0 = int(np.floor(t / b + 1e-12))
            new = np.maximum(new, np.where(best >= 0, best + n0, -1))
            best = new
        return any(best[k, k] >= 0 and best[k, k] + k >= blocks for k in range(k_max + 1))

    lo, hi = 0, len(loads) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(loads[mid]) else (mid + 1, hi)
    return loads[lo]


def block_s(costs, kinds: list[str]) -> float:
    """One block's forward + backward seconds under `costs` (a `LayerCosts`): the first block's
    entry, or its attention and MLP entries where the layer list is at half blocks (the
    granularity terms count whole blocks on either unit)."""
    first = next(i for i, k in enumerate(kinds) if k in BLOCK_KINDS)
    span = 1 if kinds[first] == "block" else 2
    return float(sum(costs.fwd_s[first : first + span]) + sum(costs.bwd_s[first : first + span]))


def pipeline_parts(cm, plan: Plan, p: int, step) -> dict:
    """Stage imbalance of pipeline `p`: sigma and its split (module docstring)."""
    pipe = plan.pipelines[p]
    mbs = pipe.micro_batch_size
    kinds = [layer.kind for layer in cm.model.layers]
    work: dict[int, float] = {}
    extra: dict[int, float] = {}
    flag: dict[int, bool] = {}
    for st, sc in zip(pipe.stages, [s for s in step.stages if s.pipeline == p]):
        d = st.device
        work[d] = work.get(d, 0.0) + sc.fwd_s + sc.bwd_s
        flag[d] = st.recomputes(plan.train)
        c = cm.layer_costs(cm.cluster.gpu(d), mbs, flag[d], st.tp)
        a, b = st.layers
        extra[d] = extra.get(d, 0.0) + sum(
            c.fwd_s[i] + c.bwd_s[i] for i in range(a, b) if kinds[i] not in BLOCK_KINDS
        )
    devs = list(work)
    costs = {d: cm.layer_costs(cm.cluster.gpu(d), mbs, flag[d]) for d in devs}
    whole = {d: costs[d].fwd_cum[-1] + costs[d].bwd_cum[-1] for d in devs}
    beta = [block_s(costs[d], kinds) for d in devs]
    blocks = cm.model.config.num_layers
    balanced = 1 / sum(1 / whole[d] for d in devs)
    sigma = max(work.values()) / balanced
    gran = best_counts(beta, [0.0] * len(devs), blocks) / (blocks / sum(1 / b for b in beta))
    counted = best_counts(beta, [extra[d] for d in devs], blocks) / balanced
    attn = attention_share(cm.model.config, cm.model.seq_len)
    halves = half_block_counts(beta, blocks, attn) / (blocks / sum(1 / b for b in beta))
    out = {
        "sigma": sigma,
        "granularity": gran - 1,
        "halves": halves - 1,
        "head": counted - gran,
        "memory": None,
        "split": sigma - counted,
        "busiest": cm.cluster.gpu(max(work, key=work.get)).name,
        "types": [cm.cluster.gpu(d).name for d in devs],
        "layers": [st.layers for st in pipe.stages],
        "mbs": mbs,
        "m": pipe.num_micro_batches,
        "schedule": pipe.schedule_in(plan.train).name,
    }
    if len(pipe.stages) == len(devs):  # one chunk: the stage DP with and without memory
        spec = pipe.schedule_in(plan.train)
        tables = [
            stage_tables(
                cm, cm.layer_costs(cm.cluster.gpu(st.device), mbs, st.recomputes(plan.train))
            )
            for st in pipe.stages
        ]
        loads = in_flight_per_stage(spec, len(tables))
        free = [(0, 0, 0)] * len(tables)
        with_mem, without = balance_stages(tables, loads), balance_stages(tables, free)

        def busiest(cuts) -> float:
            return max(t.time[a, b] for t, a, b in zip(tables, cuts, cuts[1:]))

        if with_mem and without:
            out["memory"] = (busiest(with_mem) - busiest(without)) / balanced
            out["split"] = sigma - counted - out["memory"]
            out["dp_cuts"] = with_mem
    return out


def decompose(problem: Problem, plan_: Plan) -> dict:
    cm = cost_model_for_plan(plan_)
    step = step_cost(plan_, cm)
    times = step.pipeline_time_s
    busy = busiest_work_s(step)
    slow = max(range(len(times)), key=times.__getitem__)
    total, top = step.iteration_time_s, max(times)
    pipes = [pipeline_parts(cm, plan_, p, step) for p in range(len(plan_.pipelines))]
    rates = []
    for pipe in plan_.pipelines:
        costs = {}
        for st in pipe.stages:
            c = cm.layer_costs(
                cm.cluster.gpu(st.device), pipe.micro_batch_size, st.recomputes(plan_.train)
            )
            costs[st.device] = c.fwd_cum[-1] + c.bwd_cum[-1]
        rates.append(sum(pipe.micro_batch_size / c for c in costs.values()))
    rate = sum(rates)
    bubbles = [t - pipe.num_micro_batches * b for t, pipe, b in zip(times, plan_.pipelines, busy)]
    batch = sum(r / rate * (top - t) for r, t in zip(rates, times)) / total
    other = (sum(r / rate * b for r, b in zip(rates, bubbles)) - bubbles[slow]) / total
    stage_parts = {k: 0.0 for k in ("granularity", "head", "memory", "split", "halves")}
    for pipe, parts in zip(plan_.pipelines, pipes):
        weight = pipe.micro_batch_size * pipe.num_micro_batches / rate / total
        parts["weight"] = weight
        for k in stage_parts:
            stage_parts[k] += weight * (parts[k] or 0.0)
    stage = sum(p["weight"] * (p["sigma"] - 1) for p in pipes)
    shares = step_breakdown(problem, _Result(plan_, step), physical_limit_samples_per_s(problem))
    return {
        "breakdown": shares,
        "batch": batch,
        "other_bubbles": other,
        "stage": stage,
        **stage_parts,
        "pipes": pipes,
        "slowest": slow,
        "step_s": total,
    }


def hpp_plan(problem: Problem, name: str, plans: str | None) -> Plan:
    """hpp's plan of `problem`, kept as `plans/name.json` and read back from there (`--plans`;
    None: searched every time)."""
    cached = Path(plans) / f"{name}.json" if plans else None
    if cached and cached.exists():
        return Plan.model_validate_json(cached.read_text())
    found = plan(problem, "hpp").plan
    if cached:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(found.to_json())
    return found


class _Result:
    """What `step_breakdown` reads of a `PlanResult`."""

    def __init__(self, plan_: Plan, step):
        self.plan, self.step = plan_, step


def _groups(pipes: list[dict]) -> list[tuple[int, dict]]:
    """Identical pipelines (types, layers, batch) together: (count, first one)."""
    seen: dict[tuple, list] = {}
    for p in pipes:
        key = (tuple(p["types"]), tuple(p["layers"]), p["mbs"], p["m"], p["schedule"])
        seen.setdefault(key, [0, p])[0] += 1
    return [(n, p) for n, p in seen.values()]


def _short(types: list[str]) -> str:
    run, out = None, []
    for t in types:
        if out and t == run:
            out[-1][1] += 1
        else:
            out.append([t, 1])
        run = t
    return " + ".join(f"{n} {t}" for t, n in out)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def chosen_plans(doc: str, argv: list[str] | None) -> Iterator[tuple[Path, str, Problem, Plan]]:
    """Per scenario of the suite that `--only` names: its cluster file, model, problem and hpp's
    plan (kept under `--plans` DIR, `hpp_plan`), for a bench whose description is `doc`."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--only", nargs="+", required=True, help="CLUSTER[:MODEL] scenarios")
    ap.add_argument("--plans", help="keep hpp's plans here as JSON and read them back")
    args = ap.parse_args(argv)
    for cluster_file, model, batch, seq in scenarios(False):
        if not _chosen((cluster_file, model), args.only):
            continue
        cluster, spec = load_cluster(cluster_file), load_model(model, seq)
        problem = Problem(
            spec, cluster, TrainSpec(global_batch=batch, seq_len=seq), sharding_mode="targeted"
        )
        yield (
            cluster_file,
            model,
            problem,
            hpp_plan(problem, f"{cluster_file.stem}_{model}", args.plans),
        )


def main(argv: list[str] | None = None) -> int:
    for cluster_file, model, problem, plan_ in chosen_plans(__doc__, argv):
        d = decompose(problem, plan_)
        b = d["breakdown"]
        print(
            f"\n{cluster_file.stem} {model}: step {d['step_s']:.3f} s, at limit "
            f"{_pct(b['limit'])}, bubble {_pct(b['bubble'])}, imbalance {_pct(b['imbalance'])} = "
            f"batch {_pct(d['batch'])} + other bubbles {_pct(d['other_bubbles'])} + stage "
            f"{_pct(d['stage'])} (granularity {_pct(d['granularity'])}, head/embedding "
            f"{_pct(d['head'])}, memory {_pct(d['memory'])}, split {_pct(d['split'])}); "
            f"granularity at half blocks {_pct(d['halves'])}"
        )
        for n, p in _groups(d["pipes"]):
            print(
                f"  {n} x {_short(p['types'])} {p['schedule']} mbs {p['mbs']} x {p['m']}: "
                f"sigma {p['sigma']:.3f} (granularity {_pct(p['granularity'])}, head "
                f"{_pct(p['head'])}, memory {_pct(p['memory'])}, split {_pct(p['split'])}; halves "
                f"{_pct(p['halves'])}), "
                f"busiest {p['busiest']}, layers {[b - a for a, b in p['layers']]}"
                + (f", DP cuts {p['dp_cuts']}" if "dp_cuts" in p else "")
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
