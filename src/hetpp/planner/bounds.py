"""Optimistic bounds used to skip parts of the search that cannot beat the best plan found."""

from __future__ import annotations

import numpy as np

from hetpp.cost.memory import devices_to_hold, model_state_bytes
from hetpp.planner.problem import Problem


def ideal_time_bound(problem: Problem, recompute: bool, mbs: int) -> float:
    """A lower bound on the iteration time of any plan with this micro-batch size and setting.

    A pipeline running m micro-batches takes at least m times its slowest stage. If stage s, on
    a type t_s, holds a fraction x_s of the model's work as t_s measures it (W_t: whole-model
    forward+backward time of one micro-batch on t), the slowest stage takes at least
    (sum x_s) / (sum 1/W_{t_s}). Summed over stages, x_s is at least kappa = sum over layers of
    the smallest fraction any type gives that layer (1 when types agree on layer ratios). So
    the cluster runs at most (mbs / kappa) * sum over devices of 1/W, and B samples take at
    least kappa * B / (mbs * sum 1/W).

    Tighter: a pipeline running m micro-batches by time T has m <= 1 + (T - fill) / beat, with
    fill at least F (the fastest type per layer, one micro-batch through all layers), so P
    pipelines run at most P + rate (T - F) micro-batches; P is at most the devices over the
    fewest stages a pipeline can have."""
    cm = problem.cost_model(recompute)
    fractions, per_layer, rate = [], [], 0.0
    for pool in problem.pools.values():
        costs = cm.layer_costs(pool.gpu, mbs, tp=pool.tp)
        per_layer.append(costs.fwd_s + costs.bwd_s)
        whole = float(per_layer[-1].sum())
        fractions.append(per_layer[-1] / whole)
        rate += pool.count / whole
    kappa = float(np.min(fractions, axis=0).sum())
    rate *= mbs / kappa  # samples per second, at most
    # Every pipeline also pays one micro-batch's traversal of all layers (fill) at least
    # once, on the fastest type per layer; it can gain back at most one micro-batch for it.
    fill = float(np.min(per_layer, axis=0).sum())
    pipelines = min(
        len(problem.units) // least_stages(problem, recompute, mbs),
        problem.micro_batches(mbs),
    )
    return max(problem.global_batch / rate, fill + (problem.global_batch - pipelines * mbs) / rate)


def least_stages(problem: Problem, recompute: bool, mbs: int) -> int:
    """Fewest units (devices, or TP groups) any pipeline needs: the model's weights, gradients
    and optimizer state over the largest usable unit memory (activations would only add; a TP
    group of k holds at most k devices' worth)."""
    cm = problem.cost_model(recompute)
    largest = max(p.gpu.memory_bytes * p.tp for p in problem.pools.values())
    need = devices_to_hold(model_state_bytes(cm.model, cm.train), largest, cm.train)
    return len(problem.units) + 1 if need is None else need
