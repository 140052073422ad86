"""Plans for people: one plan's pipelines and stages, and strategies side by side."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from hetpp.cost.step import device_memories
from hetpp.planner import Problem, unused_devices
from hetpp.planner.assemble import PlanResult
from hetpp.specs.plan import Plan


def plan_table(problem: Problem, result: PlanResult) -> Table:
    """One plan: pipelines (identical ones on one row group), stages with GPU type, devices and
    layers, batch shares, memory headroom."""
    plan, step = result.final_plan(), result.step
    assert plan is not None and step is not None
    cl = problem.cluster
    caption = "identical pipelines share rows: pipes = how many, batch = each one's share"
    if plan.model.layer_unit == "half":
        caption += (
            f"; layers count half blocks: 0 embedding, 2b+1 and 2b+2 block b's attention and "
            f"MLP, {plan.model.head_index} the head"
        )
    table = Table(
        title=f"{plan.strategy} plan: {plan.model.name}, {cl.name}, "
        f"global batch {plan.global_batch} x {plan.seq_len} tokens",
        caption=caption,
    )
    cols = ("pipes", "schedule", "stage", "GPU", "TP", "devices", "layers", "mbs x m", "batch")
    for col in (*cols, "free mem"):
        right = col in ("pipes", "stage", "TP", "batch", "free mem")
        table.add_column(col, justify="right" if right else "left", no_wrap=True, min_width=4)
    costs = {(s.pipeline, s.stage): s for s in step.stages}
    memories = device_memories(step.stages)
    groups: dict[tuple, list[int]] = {}
    for p, pipe in enumerate(plan.pipelines):
        shape = tuple((cl.gpu(st.device).name, st.tp, st.layers) for st in pipe.stages)
        key = (shape, pipe.micro_batch_size, pipe.num_micro_batches, pipeline_schedule(plan, p))
        groups.setdefault(key, []).append(p)
    for (shape, mbs, m, schedule), members in groups.items():
        for s, (gpu, tp, layers) in enumerate(shape):
            # free memory per device: a device running several stages holds them all
            free = min(costs[(p, s)].capacity_bytes - memories[costs[(p, s)].device][0].total
                       for p in members)  # fmt: skip
            first = s == 0
            table.add_row(
                str(len(members)) if first else "",
                schedule if first else "",
                str(s),
                gpu,
                str(tp),
                _brief(sorted(d for p in members for d in plan.pipelines[p].stages[s].devices)),
                f"[{layers[0]}, {layers[1]})",
                f"{mbs} x {m}" if first else "",
                str(mbs * m) if first else "",
                f"{free / 1e9:.1f} GB",
            )
        table.add_section()
    return table


def print_plan(problem: Problem, result: PlanResult, console: Console | None = None) -> None:
    """The plan table, then time, throughput, search time, unused devices and any note."""
    plan, step = result.final_plan(), result.step
    assert plan is not None and step is not None
    console = console or Console()
    console.print(plan_table(problem, result))
    unused = unused_devices(problem, plan)
    console.print(
        f"iteration {step.iteration_time_s:.3f} s (pipelines {max(step.pipeline_time_s):.3f} s, "
        f"exposed sync {step.exposed_sync_s:.3f} s, optimizer {step.optimizer_s:.3f} s), "
        f"throughput {step.throughput_samples_per_s:.2f} samples/s, "
        f"{recompute_summary(plan)}, search {result.search_time_s:.2f} s"
    )
    if plan.sharding == "full":
        console.print(
            f"sharding full: FSDP over all {plan.num_devices} devices (pipelines: the slowest "
            "device at its own speed; exposed sync: the FSDP communication prefetch leaves)"
        )
    if plan.optimizer_shards > 1:
        console.print(
            f"optimizer sharding: each bucket's optimizer state split over its "
            f"{plan.optimizer_shards} owners (reduce-scatter, step, all-gather)"
        )
    if unused:
        console.print(f"unused devices: {_ranges(unused)}")
    if result.note:
        console.print(f"note: {result.note}")


def _brief(ids: list[int], width: int = 11) -> str:
    """Id ranges, or first..last with the count when that would not fit a table cell."""
    text = _ranges(ids)
    return text if len(text) <= width else f"{ids[0]}..{ids[-1]}"


def _ranges(ids: list[int]) -> str:
    out, start = [], None
    for i, d in enumerate(ids):
        if start is None:
            start = d
        if i + 1 == len(ids) or ids[i + 1] != d + 1:
            out.append(f"{start}" if start == d else f"{start}-{d}")
            start = None
    return ", ".join(out)


def comparison_table(results: list[PlanResult]) -> Table:
    """Every strategy's throughput, iteration time, hpp's speed-up over it (hpp gain),
    pipelines, GPUs used and search time."""
    hpp = next(r for r in results if r.strategy == "hpp")
    table = Table(title="planner strategies (same cost model)")
    cols = ("strategy", "samples/s", "step", "hpp gain", "pipes", "schedules", "GPUs", "search")
    for col in cols:
        table.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    for r in results:
        if not r.feasible or r.plan is None:
            table.add_row(r.strategy, "-", "-", "-", "-", "-", "-", f"({r.note or 'infeasible'})")
            continue
        speedup = hpp.throughput_samples_per_s / r.throughput_samples_per_s if hpp.feasible else 0
        table.add_row(
            r.strategy,
            f"{r.throughput_samples_per_s:.2f}",
            f"{r.iteration_time_s:.3f} s",
            f"{speedup:.2f}x" if speedup else "-",
            str(len(r.plan.pipelines)),
            schedule_summary(r.plan),
            str(r.plan.num_devices),
            f"{r.search_time_s:.2f} s",
        )
    return table


def pipeline_schedule(plan: Plan, p: int) -> str:
    """Pipeline p's schedule, with its chunks per device when it has several ('zbv/2')."""
    pipe = plan.pipelines[p]
    name = pipe.schedule_in(plan.train).name
    return f"{name}/{pipe.chunks}" if pipe.chunks > 1 else name


def schedule_summary(plan: Plan) -> str:
    """The plan's schedules with how many pipelines run each: '12 zbv/2 + 4 1f1b'."""
    count = Counter(pipeline_schedule(plan, p) for p in range(len(plan.pipelines)))
    if len(count) == 1:
        return next(iter(count))
    return " + ".join(f"{n} {name}" for name, n in count.most_common())


def recompute_summary(plan: Plan) -> str:
    """'recompute off', 'recompute on' (every stage) or 'recompute on k of n stages'."""
    stages = [st for pipe in plan.pipelines for st in pipe.stages]
    on = sum(st.recomputes(plan.train) for st in stages)
    if on in (0, len(stages)):
        return f"recompute {'on' if on else 'off'}"
    return f"recompute on {on} of {len(stages)} stages"
