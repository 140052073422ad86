"""The simulator's per-rank order against torch.distributed.pipelining's own schedules.

Each registry entry names the torch class the runtime builds; here that class runs one step on
a stand-in stage that records what it is asked to compute (no process group, no tensors), and
the simulator's forwards and backwards must come in the same order on every rank. The executed
order is the reference rather than `_get_pipeline_order()`: in torch 2.13 that IR numbers the
last stage's 1F1B forwards from 1, while the schedule itself runs them from 0.
"""

from __future__ import annotations

import pytest

from hetpp.sim.schedule import stage_actions
from hetpp.specs.schedule import SCHEDULES

pipelining = pytest.importorskip("torch.distributed.pipelining")


class RecordingStage:
    """What a PipelineScheduleSingle asks of its stage, recording compute calls only."""

    def __init__(self, index: int, num_stages: int):
        self.stage_index, self.num_stages = index, num_stages
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.log: list[str] = []

    def get_fwd_recv_ops(self, k):
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, k, *args, **kwargs):
        self.log.append(f"{self.stage_index}F{k}")

    def backward_one_chunk(self, k, **kwargs):
        self.log.append(f"{self.stage_index}B{k}")

    def perform_reduce_grad(self, *args):
        pass


def torch_order(torch_class: str, stage: int, num_stages: int, m: int) -> list[str]:
    rec = RecordingStage(stage, num_stages)
    schedule = getattr(pipelining, torch_class)(rec, m)
    schedule._initialize_stage = lambda *a, **k: None  # shape inference needs real tensors
    schedule._step_microbatches([()] * m, [{}] * m)
    return rec.log


# Single-stage schedules: the multi-chunk entries' orders are the planning half of issue 13's.
@pytest.mark.parametrize("name", [n for n, s in SCHEDULES.items() if s.placement == "one"])
def test_simulated_order_is_torchs_for_up_to_8_stages_and_24_micro_batches(name):
    spec = SCHEDULES[name]
    checked = 0
    for num_stages in range(1, 9):
        for m in range(spec.min_micro_batches(num_stages), 25):
            for s in range(num_stages):
                sim = [
                    str(a) for a in stage_actions(name, s, num_stages, m) if a.kind in ("F", "B")
                ]
                assert sim == torch_order(spec.torch_class, s, num_stages, m), (num_stages, m, s)
                checked += 1
    assert checked > 500
