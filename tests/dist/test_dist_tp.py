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


def _named(stage: StageModule):
    for i in range(stage.start, stage.end):
        yield from (((i, n), p) for n, p in stage.layer(i).named_parameters())


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
            "param": max((params[k] - p).abs().max().item() for k, p in _named(ref)),
            "grad": max((grads[k] - p.grad).abs().max().item() for k, p in _named(ref)),
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


def _tp_pipeline(groups: list[tuple[int, ...]], cuts: list[int], mbs: int, m: int):
    from hetpp.specs import PipelinePlan, StagePlan

    stages = tuple(
        StagePlan(devices=g, layers=(a, b)) for g, a, b in zip(groups, cuts[:-1], cuts[1:])
    )
    return PipelinePlan(stages=stages, micro_batch_size=mbs, num_micro_batches=m)


PLANS = {
    # Pipeline 0: two TP-2 stages; pipeline 1: two single-device stages cut elsewhere, so the
    # gradient blocks [0, 2), [2, 3), [3, 6) have owners of degree 2 and 1.
    "tiny-llama": ("tiny-llama", [([(0, 1), (2, 3)], [0, 3, 6], 2), ([(4,), (5,)], [0, 2, 6], 3)]),
    # Tied embedding/head and biases: one TP-4 stage holding the whole model (one tied tensor)
    # next to two single-device stages (a copy on each end) and a TP-2 pipeline.
    "tiny-gpt": (
        "tiny-gpt",
        [([(0, 1, 2, 3)], [0, 6], 2), ([(4,), (5,)], [0, 3, 6], 2), ([(6, 7)], [0, 6], 1)],
    ),
    # The degree changes inside a pipeline (`runtime.lanes`): TP-2 then TP-1 beside a plain
    # pipeline cut elsewhere (the embedding on a TP stage, the head not) ...
    "2-1": ("tiny-llama", [([(0, 1), (2,)], [0, 4, 6], 2), ([(4,), (5,)], [0, 2, 6], 2)]),
    # ... and 1 -> 2 -> 1 with the tied embedding/head on the plain ends, beside one device
    # holding the whole model: activations widen and narrow, gradients narrow and widen; under
    # GPipe (torch sorts its sends by peer there), the others under 1F1B.
    "1-2-1": ("tiny-gpt", [([(0,), (1, 2), (3,)], [0, 2, 4, 6], 3), ([(4,)], [0, 6], 1)], "gpipe"),
}


@pytest.mark.dist
@pytest.mark.parametrize("case", PLANS)
def test_pipelines_with_and_without_tp_train_as_one_process(tmp_path, case):
    from disthelpers import make_plan, train

    model, pipes, *schedule = PLANS[case]
    pipes = [_tp_pipeline(groups, cuts, 1, m) for groups, cuts, m in pipes]
    plan = make_plan(model, pipes, *schedule)
    kw = dict(steps=3, fp64=True, lr=3e-3, clip_grad=0.5, eval_every=3, verify=True)
    results = train(plan, tmp_path, **kw)
    report = results[0].verify
    assert report.ok and report.max_param_diff <= 1e-10 and report.max_loss_diff <= 1e-10, report
    assert all(r.grad_norm > 0 for r in results[0].records)


@pytest.mark.dist
def test_a_tp_checkpoint_is_a_model_state_that_resumes_with_or_without_tp(tmp_path):
    from disthelpers import make_plan, train

    from hetpp.runtime import checkpoint

    # Written by TP-2 -> TP-1 beside a plain pipeline, resumed by a single TP-2 stage holding
    # the whole model; --verify's reference resumes the same files without TP.
    tp_mixed = make_plan(
        "tiny-llama",
        [_tp_pipeline([(0, 1), (2,)], [0, 4, 6], 1, 2), _tp_pipeline([(3,)], [0, 6], 1, 2)],
    )
    tp_whole = make_plan("tiny-llama", [_tp_pipeline([(0, 1)], [0, 6], 2, 2)])
    ckpt = tmp_path / "ckpt"
    kw = dict(fp64=True, lr=3e-3, checkpoint_dir=str(ckpt))
    first = train(tp_mixed, tmp_path, steps=2, **kw)
    files = sorted(p.name for p in checkpoint.latest(ckpt).iterdir())
    assert files == ["COMPLETE", *(f"layer_{i:04d}.pt" for i in range(6)), "meta.json"]
    resumed = train(tp_whole, tmp_path, steps=4, resume=True, verify=True, **kw)
    whole = train(tp_mixed, tmp_path, steps=4, fp64=True, lr=3e-3)

    assert [r.step for res in (first, resumed) for r in res[0].records] == [1, 2, 3, 4]
    losses = [r.loss for res in (first, resumed) for r in res[0].records]
    assert losses == pytest.approx([r.loss for r in whole[0].records], abs=1e-10, rel=0)
    report = resumed[0].verify
    assert report.ok and report.max_param_diff <= 1e-10, report
