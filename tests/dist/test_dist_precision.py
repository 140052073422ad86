"""fp16 loss scaling: an overflow on one rank makes every rank skip the step and back off."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from disthelpers import make_plan, pipeline, run_ranks

from hetpp.runtime import trainer
from hetpp.runtime.env import DistEnv
from hetpp.runtime.options import TrainOptions
from hetpp.specs.plan import load_plan

pytestmark = pytest.mark.dist


def _two_steps(rank: int, world: int, init: str, path: str) -> list[tuple[float, bool]]:
    """(loss scale after the step, whether this rank's parameters changed) for steps 1 and 2;
    rank 1 sees an inf in its gradients in step 1."""
    real = trainer.has_nonfinite
    calls = []

    def fake(params, device):
        calls.append(1)
        flag = real(params, device)
        return flag + (1.0 if rank == 1 and len(calls) == 1 else 0.0)

    trainer.has_nonfinite = fake  # this forked worker's module only
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    env = DistEnv(rank=rank, world_size=world, init_method=init)
    t = trainer.RankTrainer(
        load_plan(path), TrainOptions(plan=path), env, trainer.Activity(), torch.device("cpu")
    )
    out = []
    for step in (1, 2):
        before = [p.detach().clone() for p in t.model.parameters()]
        t.step(step)
        changed = any(not torch.equal(a, p) for a, p in zip(before, t.model.parameters()))
        out.append((t.scaler.scale, changed))
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("masters", ["params", "optimizer"])
def test_an_overflow_on_one_rank_skips_the_step_everywhere(tmp_path, masters):
    plan = make_plan(
        "tiny-gpt",
        [pipeline([0, 1], [0, 3, 6], 1, 2), pipeline([2], [0, 6], 2, 1)],
        precision="fp16",
    )
    if masters == "optimizer":  # fp16 parameters, sharded fp32 masters: the same loss scaling
        train = plan.train.model_copy(update={"master_weights": "optimizer"})
        plan = plan.model_copy(update={"train": train, "sharding": "optimizer"})
    path = tmp_path / "plan.json"
    plan.save(path)
    results = run_ranks(_two_steps, plan.num_devices, str(path))
    # Step 1 skipped on every rank, scale halved; step 2 updates everywhere at the new scale.
    assert results == [[(2.0**15, False), (2.0**15, True)]] * plan.num_devices
