"""A stage split over a TP group of gloo ranks computes what the unsharded stage computes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from disthelpers import run_ranks
from torch.distributed.device_mesh import init_device_mesh

from hetpp.runtime.model import StageModule, token_loss_sum
from hetpp.runtime.tp import parallelize_stage, qkv_rows
from hetpp.specs import PRESETS


def _loss(stage: StageModule, tokens: torch.Tensor) -> torch.Tensor:
    logits = stage(tokens[:, :-1])
    return token_loss_sum(logits, tokens[:, 1:])


def _tp_rank(rank: int, world: int, init: str, model: str) -> dict:
    from hetpp.runtime.tp import full_state

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        c = PRESETS[model]
        tokens = torch.randint(0, c.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
        ref = StageModule(c, 0, c.num_layers + 2, seed=0, dtype=torch.float64)
        ref_loss = _loss(ref, tokens)
        ref_loss.backward()
        stage = StageModule(c, 0, c.num_layers + 2, seed=0, dtype=torch.float64)
        parallelize_stage(stage, init_device_mesh("cpu", (world,)))
        loss = _loss(stage, tokens)
        loss.backward()
        params, grads = full_state(stage), full_state(stage, grads=True)
        local = dict(stage.named_parameters())["layers.1.attn.qkv.weight"].to_local().shape
        return {
            "loss": abs(loss.item() - ref_loss.item()),
            "param": max((params[n] - p).abs().max().item() for n, p in ref.named_parameters()),
            "grad": max(
                (grads[n] - p.grad).abs().max().item() for n, p in ref.named_parameters()
            ),
            "local_qkv": tuple(local),
        }
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("model", "world"), [("tiny-llama", 2), ("tiny-gpt", 4)])
def test_a_tp_stage_matches_the_unsharded_stage_in_float64(model, world):
    c = PRESETS[model]
    out = run_ranks(_tp_rank, world, model)
    for r in out:
        assert r["loss"] < 1e-10 and r["param"] == 0 and r["grad"] < 1e-10, r
        qkv = c.q_dim + 2 * c.kv_heads * c.head_dim
        assert r["local_qkv"] == (qkv // world, c.hidden_size)


def test_qkv_rows_give_each_rank_its_heads():
    c = PRESETS["tiny-llama"]  # 4 query heads of 16, 2 KV heads
    rows = qkv_rows(c, 2).tolist()
    q, kv = 64, 32
    assert rows[:32] == list(range(32)) and rows[32:48] == list(range(q, q + 16))
    assert rows[48:64] == list(range(q + kv, q + kv + 16))
    assert sorted(rows) == list(range(q + 2 * kv))
