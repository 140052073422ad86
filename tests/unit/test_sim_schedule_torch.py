"""The simulator's per-rank order against torch.distributed.pipelining's own schedules.

Each registry entry names the torch class the runtime builds; here that class runs one step on
a stand-in stage that records what it is asked to compute (no process group, no tensors), and
the simulator's forwards and backwards must come in the same order on every rank. The executed
order is the reference rather than `_get_pipeline_order()`: in torch 2.13 that IR numbers the
last stage's 1F1B forwards from 1, while the schedule itself runs them from 0.
"""

from __future__ import annotations

import pytest

from hetpp.sim.schedule import rank_actions
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


@pytest.mark.parametrize("name", [n for n, s in SCHEDULES.items() if not s.multi_stage])
def test_simulated_order_is_torchs_for_up_to_8_stages_and_24_micro_batches(name):
    spec = SCHEDULES[name]
    checked = 0
    for num_stages in range(1, 9):
        for m in range(spec.min_micro_batches(num_stages), 25):
            for s in range(num_stages):
                sim = [str(a) for a in rank_actions(name, s, num_stages, m) if a.kind in ("F", "B")]
                assert sim == torch_order(spec.torch_class, s, num_stages, m), (num_stages, m, s)
                checked += 1
    assert checked > 500


class PlacedStage:
    """The attributes a PipelineScheduleMulti reads from its stages at construction."""

    def __init__(self, index: int, num_stages: int, num_ranks: int):
        import torch

        self.stage_index, self.num_stages = index, num_stages
        self.group_size, self.group_rank = num_ranks, 0
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.submod = torch.nn.Identity()  # the split-backward schedules check it is a Module


def torch_pipeline_order(spec, num_ranks: int, chunks: int, m: int) -> dict[int, list[str]]:
    """torch's own `pipeline_order` (rank -> compute actions), idle slots dropped and DualPipeV's
    overlapped F+B pairs written as their two sub-actions, in the order torch runs them."""
    from torch.distributed.pipelining._utils import generate_rank_to_stage_mapping

    num_stages = num_ranks * chunks
    style = "v" if spec.placement == "v" else "loop"
    mine = generate_rank_to_stage_mapping(num_ranks, num_stages, style)[0]
    stages = [PlacedStage(i, num_stages, num_ranks) for i in mine]
    schedule = getattr(pipelining, spec.torch_class)(stages, m)
    return {
        rank: [str(x) for a in acts if a is not None for x in (a.sub_actions or (a,))]
        for rank, acts in schedule.pipeline_order.items()
    }


MULTI = [name for name, spec in SCHEDULES.items() if spec.multi_stage]


@pytest.mark.parametrize("name", MULTI)
def test_multi_stage_orders_are_torchs_pipeline_order(name):
    spec = SCHEDULES[name]
    checked = 0
    for num_ranks in range(1, 5):
        for chunks in {"one": (1,), "loop": (2, 3, 4), "v": (2,)}[spec.placement]:
            num_stages = num_ranks * chunks
            for m in range(1, 13):
                if spec.micro_batch_problem(num_stages, num_ranks, m) is not None:
                    with pytest.raises(ValueError):
                        torch_pipeline_order(spec, num_ranks, chunks, m)
                    continue
                want = torch_pipeline_order(spec, num_ranks, chunks, m)
                for rank in range(num_ranks):
                    got = [f"{s}{k}{mb}" for k, s, mb in spec.order(rank, num_ranks, chunks, m)]
                    assert got == want[rank], (num_ranks, chunks, m, rank)
                    checked += 1
    assert checked >= 50
