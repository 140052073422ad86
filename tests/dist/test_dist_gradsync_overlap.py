"""Block-wise gradient sync overlaps the schedule under every schedule the runtime executes: each
bucket's all-reduce starts during the step's backwards (per stage, after its last full backward or
weight-grad action), none is left for `GradSync.sync` to start after the schedule. Exactness of
the sums is the equivalence tests' (test_dist_equivalence.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from disthelpers import TIMEOUT_S, make_plan, pipeline, run_ranks

from hetpp.runtime import trainer
from hetpp.runtime.env import DistEnv
from hetpp.runtime.gradsync import GradSync
from hetpp.runtime.options import TrainOptions
from hetpp.specs.plan import load_plan

pytestmark = pytest.mark.dist


def _issued_before_sync(rank: int, world: int, init: str, path: str) -> list[tuple[int, int]]:
    """(buckets started when `sync` is called, buckets of this rank) for two steps."""
    seen: list[tuple[int, int]] = []
    real = GradSync.sync

    def spy(self, note):
        seen.append((self.issued, len(self.buckets)))
        return real(self, note)

    GradSync.sync = spy  # this forked worker's class only
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    env = DistEnv(rank=rank, world_size=world, init_method=init)
    opts = TrainOptions(plan=path, fp64=True, timeout_s=TIMEOUT_S)
    t = trainer.RankTrainer(load_plan(path), opts, env, trainer.Activity(), torch.device("cpu"))
    for step in (1, 2):
        t.step(step)
    dist.destroy_process_group()
    return seen


# Both pipelines' stages are cut differently, so each rank has buckets of several blocks, and
# ranks with two chunks have buckets of both.
PLANS = {
    "1f1b": [pipeline([0, 1], [0, 3, 6], 1, 2), pipeline([2, 3], [0, 2, 6], 1, 2)],
    "interleaved-1f1b": [
        pipeline([0, 1, 0, 1], [0, 1, 3, 4, 6], 1, 4, schedule="interleaved-1f1b"),
        pipeline([2, 3], [0, 2, 6], 1, 2),
    ],
    "interleaved-zb": [
        pipeline([0, 1, 0, 1], [0, 1, 3, 4, 6], 1, 4, schedule="interleaved-zb"),
        pipeline([2, 3], [0, 2, 6], 1, 2),
    ],
    "zbv": [
        pipeline([0, 1, 1, 0], [0, 2, 3, 5, 6], 1, 4, schedule="zbv"),
        pipeline([2, 3], [0, 3, 6], 1, 2),
    ],
}


@pytest.mark.parametrize("schedule", list(PLANS))
def test_every_bucket_starts_before_the_schedule_returns(schedule, tmp_path):
    plan = make_plan("tiny-llama", PLANS[schedule])
    path = tmp_path / "plan.json"
    plan.save(path)
    results = run_ranks(_issued_before_sync, plan.num_devices, str(path))
    assert all(n > 0 for steps in results for _, n in steps)  # every rank has buckets
    assert all(issued == n for steps in results for issued, n in steps), results
