"""Recomputation per stage: a plan searched with recomputation on pays for it only where needed.

The search decides recomputation for a whole plan (it sizes stages and batch shares with it). A
stage that fits its device without it should not pay the extra forward in backward, so this
post-pass turns it off on each such stage (`StagePlan.recompute = False`); the caller re-costs the
plan (`step_cost` honours per-stage flags). Turning recomputation off only makes a stage faster,
so the plan's speed can only improve; the batch split is kept as the search made it.
"""

from __future__ import annotations

from hetpp.cost.memory import stage_memory
from hetpp.cost.step import stage_layer_costs
from hetpp.planner.problem import Problem
from hetpp.specs.plan import Plan


def drop_unneeded_recompute(problem: Problem, plan: Plan) -> Plan:
    """`plan` with recomputation off on every stage that fits without it."""
    if not plan.train.recompute:
        return plan
    cm = problem.cost_model(False, shards=1)
    cluster = problem.cluster
    pipelines = []
    for pipe in plan.pipelines:
        if pipe.chunks > 1:  # a device's stages share its memory: judged together, left as is
            pipelines.append(pipe)
            continue
        stages = []
        for s, st in enumerate(pipe.stages):
            gpu = cluster.gpu(st.device)
            costs = stage_layer_costs(cm, st, pipe.micro_batch_size, recompute=False)
            m = pipe.num_micro_batches
            spec = pipe.schedule_in(plan.train)
            k = spec.in_flight(s, len(pipe.stages), m)
            shards = plan.optimizer_shards
            mem = stage_memory(cm.model, cm.train, costs, *st.layers, k, m, shards, spec)
            fits = mem.total <= gpu.memory_bytes
            stages.append(st.model_copy(update={"recompute": False}) if fits else st)
        pipelines.append(pipe.model_copy(update={"stages": tuple(stages)}))
    return plan.model_copy(update={"pipelines": tuple(pipelines)})
