"""Why no plan fits: a message that says what does not fit where, and by how much."""

from __future__ import annotations

from hetpp.cost.memory import model_state_bytes, usable_bytes
from hetpp.planner.bounds import least_stages
from hetpp.planner.partition import stage_tables
from hetpp.planner.problem import Problem

GB = 1e9


def explain_infeasible(problem: Problem, note: str = "") -> str:
    """The first reason found, checked at the most lenient settings the problem allows
    (smallest micro-batch size, recomputation if permitted)."""
    name, b = problem.model.name, problem.global_batch
    sizes = problem.batch_sizes()
    if not sizes:
        return (
            f"global batch {b} is not a multiple of any micro-batch size in "
            f"{', '.join(map(str, problem.micro_batch_sizes))}"
        )
    mbs, recompute = sizes[0], max(problem.recompute_options())
    cm = problem.cost_model(recompute)
    train = cm.train
    biggest = max(problem.pools.values(), key=lambda p: p.gpu.memory_bytes)
    setting = f"micro-batch size {mbs}" + (", with recomputation" if recompute else "")
    tables = stage_tables(cm, cm.layer_costs(biggest.gpu, mbs, tp=biggest.tp))
    need = [
        (tables.memory(i, i + 1, (1, 1, 1)), layer.kind) for i, layer in enumerate(cm.model.layers)
    ]
    worst, kind = max(need)
    if worst > biggest.gpu.memory_bytes:
        return (
            f"{name} does not fit: its {kind} layer alone needs {worst / GB:.1f} GB on one device "
            f"at {setting} (weights, gradients, optimizer state, activations and the "
            f"{train.reserve_gb:g} GB reserve); the largest device, {biggest.gpu.name}, has "
            f"{biggest.gpu.memory_bytes / GB:.0f} GB"
        )
    states = model_state_bytes(cm.model, train)
    usable = sum(
        max(0.0, usable_bytes(p.gpu.memory_bytes, train)) * p.count for p in problem.pools.values()
    )
    if states > usable:
        return (
            f"{name} needs at least {states / GB:.0f} GB for weights, gradients and optimizer "
            f"state ({train.state_bytes_per_param:g} B x {cm.model.total_params / 1e9:.2f} B "
            f"parameters); the cluster's {problem.cluster.num_devices} devices have "
            f"{usable / GB:.0f} GB in total after the {train.reserve_gb:g} GB reserve each"
        )
    depth = least_stages(problem, recompute, mbs)
    per_device = states / depth / GB
    least = problem.schedule_spec.min_micro_batches(depth)
    if b // mbs < least:
        return (
            f"global batch {b} is too small: {name} needs at least {depth} pipeline stages "
            f"({per_device:.0f} GB of model state per device on the largest device, "
            f"{biggest.gpu.name}, {biggest.gpu.memory_bytes / GB:.0f} GB) and {problem.schedule} "
            f"needs at least {least} micro-batches for them; use a global batch of at least "
            f"{least * mbs}"
        )
    return (
        f"no split of {name} fits at {setting}: it needs at least {depth} devices of the "
        f"largest kind ({biggest.gpu.name}, {biggest.gpu.memory_bytes / GB:.0f} GB) for its "
        f"{states / GB:.0f} GB of model state, and no pipeline of the available devices holds "
        f"it with its activations" + (f" ({note})" if note else "")
    )
