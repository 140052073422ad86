"""On forked ranks: a warm-up + cosine schedule with weight decay still matches single-process
training (--verify), and every step's metrics carry the gradient norm and the rate; validation
runs every K steps through the pipelines and equals the single-process loss on the same batch."""

from __future__ import annotations

import pytest
import torch
from disthelpers import make_plan, pipeline, train

from hetpp.runtime import checkpoint
from hetpp.runtime.data import validation_batch
from hetpp.runtime.model import StageModule, token_loss_sum
from hetpp.runtime.optim import lr_factor
from hetpp.runtime.options import TrainOptions

pytestmark = pytest.mark.dist


def test_schedule_decay_validation_and_metrics(tmp_path):
    plan = make_plan(
        "tiny-llama", [pipeline([0, 1], [0, 3, 6], 2, 2), pipeline([2], [0, 6], 1, 3)]
    )
    kw = dict(steps=4, fp64=True, lr=3e-3, weight_decay=0.1, warmup_steps=2,
              lr_schedule="cosine", eval_every=2, eval_batches=2, verify=True)
    ckpt = tmp_path / "ckpt"
    result = train(plan, tmp_path, checkpoint_dir=str(ckpt), **kw)[0]
    assert result.verify.ok, result.verify
    opts = TrainOptions(plan="-", **kw)
    assert [r.lr for r in result.records] == pytest.approx(
        [3e-3 * lr_factor(s, opts) for s in range(4)]
    )
    assert all(r.grad_norm is not None and r.grad_norm > 0 for r in result.records)
    assert [r.val_loss is not None for r in result.records] == [False, True, False, True]
    # The last validation is the final weights' mean loss on the held-out batches.
    model = StageModule(plan.model, 0, 6, seed=0, dtype=torch.float64)
    checkpoint.load(checkpoint.latest(ckpt), model, torch.optim.SGD(model.parameters(), lr=0.0))
    rows = validation_batch(None, plan, seed=0, count=2 * plan.global_batch)
    with torch.no_grad():
        want = token_loss_sum(model(rows[:, :-1]), rows[:, 1:]).item() / rows[:, 1:].numel()
    assert abs(result.records[-1].val_loss - want) <= 1e-10
