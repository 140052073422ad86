"""`hetpp train --memory-report`: each rank's measured memory beside the cost model's prediction.

The runtime measures (`runtime/memory.py`); this side predicts with the same cost model the
planner used, each device's memory as its feasibility check charges it
(`cost.step.device_memories`: a device running several stages, under an interleaved or V
schedule, holds their sum, `cost.memory.device_memory`), and compares like with like: on CPU
the measurement counts model states, what the in-flight micro-batches hold and torch's receive
buffers, so the prediction is those three terms (no transients, no reserve); on CUDA the
allocator's peak is set beside the whole device memory less the reserve.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from hetpp.cost.step import cost_model_for_plan, device_memories, stage_costs
from hetpp.specs.plan import Plan

MB = 1e6


def memory_rows(plan: Plan, measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured `{"kind": "memory"}` records with the prediction and the error added."""
    cm = cost_model_for_plan(plan)
    stages, _ = stage_costs(plan, cm)
    memories = device_memories(stages)
    # every rank of a TP stage holds the same share (`cost.tp`)
    by_device: dict[int, list] = {}
    for st in stages:
        for d in plan.pipelines[st.pipeline].stages[st.stage].devices:
            by_device.setdefault(d, []).append(st)
    rows = []
    for m in measured:
        own = by_device[m["device"]]
        mem, _ = memories[own[0].device]
        states = mem.weights + mem.grads + mem.optimizer
        acts = mem.activations
        if m["method"].startswith("cuda"):
            acts += mem.transient
        predicted = states + acts + mem.recv_buffers
        rows.append(
            {
                **m,
                "pipeline": own[0].pipeline,
                "stage": own[0].stage,
                "stages": [st.stage for st in own],
                "predicted_bytes": predicted,
                "predicted_states_bytes": states,
                "predicted_activation_bytes": acts,
                "predicted_recv_buffer_bytes": mem.recv_buffers,
                "error": m["measured_bytes"] / predicted - 1,
            }
        )
    return rows


def print_memory_report(rows: list[dict[str, Any]]) -> None:
    """predicted / measured MB per rank: model states, activations, total, and the error."""
    t = Table(title=f"memory per rank, predicted / measured MB ({rows[0]['method']})")
    for col in ("rank", "pipe", "stage", "states", "activations", "buffers", "total", "error"):
        t.add_column(col, justify="right")
    for r in rows:
        pairs = [
            f"{r[f'predicted_{k}bytes'] / MB:.2f} / {r[f'measured_{k}bytes'] / MB:.2f}"
            for k in ("states_", "activation_", "recv_buffer_", "")
        ]
        stages = ",".join(map(str, r["stages"]))
        t.add_row(str(r["rank"]), str(r["pipeline"]), stages, *pairs, f"{r['error']:+.1%}")
    Console().print(t)
