"""Block-wise gradient sync overlaps the schedule under every schedule the runtime executes: each
bucket's all-reduce starts inside the very compute action that makes it (and every bucket before
it in `grad_buckets` order) complete, that is the last action of the step that writes the weight
gradients of one of its stages (a full backward, or a weight-grad action of a split one), and
none is left for `GradSync.sync` to start after the schedule. Exactness of the sums is the
equivalence tests' (test_dist_equivalence.py): a bucket started earlier would sum partial
gradients there.

The expected action is worked out from the actions the schedule ran, not from torch's
`last_backward` flag, which is what `GradSync` itself follows."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from disthelpers import TIMEOUT_S, make_plan, pipeline, run_ranks

from hetpp.runtime import trainer
from hetpp.runtime.env import DistEnv
from hetpp.runtime.gradsync import GradSync
from hetpp.runtime.options import TrainOptions
from hetpp.runtime.stage import TimedStage
from hetpp.specs.plan import load_plan

pytestmark = pytest.mark.dist


def _record(log: list[tuple]) -> None:
    """Log, in this forked worker's classes only, each compute action as ("act", stage index,
    whether it writes weight gradients), each bucket start and the call of `sync`."""
    forward, backward = TimedStage.forward_one_chunk, TimedStage.backward_one_chunk
    weight, start, sync = TimedStage.backward_weight_one_chunk, GradSync._start, GradSync.sync

    def fwd(self, *args, **kwargs):
        log.append(("act", self.stage_index, False))
        return forward(self, *args, **kwargs)

    def bwd(self, *args, **kwargs):  # an input-grad part (full_backward=False) writes none
        log.append(("act", self.stage_index, kwargs.get("full_backward", True)))
        return backward(self, *args, **kwargs)

    def wgt(self, *args, **kwargs):
        log.append(("act", self.stage_index, True))
        return weight(self, *args, **kwargs)

    def started(self, bucket):
        log.append(("start", self.buckets.index(bucket)))
        return start(self, bucket)

    def synced(self, note):
        log.append(("sync",))
        return sync(self, note)

    TimedStage.forward_one_chunk, TimedStage.backward_one_chunk = fwd, bwd
    TimedStage.backward_weight_one_chunk, GradSync._start, GradSync.sync = wgt, started, synced


def _starts(rank: int, world: int, init: str, path: str) -> tuple[int, list]:
    """This rank's number of stages, and per step of two: (rows, index of its last action that
    writes weight gradients), a row per bucket: (bucket, index of the action it started in,
    index of the action that completed it and every bucket before it); -1 for a bucket started
    in `sync`."""
    log: list[tuple] = []
    _record(log)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    env = DistEnv(rank=rank, world_size=world, init_method=init)
    opts = TrainOptions(plan=path, fp64=True, timeout_s=TIMEOUT_S)
    t = trainer.RankTrainer(load_plan(path), opts, env, trainer.Activity(), torch.device("cpu"))
    stages_of = [  # global stage indices holding each bucket's parameters on this rank
        {t.role.stages[k] for k, own in enumerate(t.sync.stage_params) for _, b in own if b is bk}
        for bk in t.sync.buckets
    ]
    out = []
    for step in (1, 2):
        log.clear()
        t.step(step)
        acts = [e for e in log if e[0] == "act"]
        last = {s: i for i, (_, s, writes) in enumerate(acts) if writes}
        done = [max(last[s] for s in stages) for stages in stages_of]
        rows, seen, in_sync = [], -1, False
        for e in log:
            if e[0] == "act":
                seen += 1
            in_sync = in_sync or e[0] == "sync"
            if e[0] == "start":
                b = e[1]
                rows.append((b, -1 if in_sync else seen, max(done[: b + 1])))
        out.append((rows, max(last.values())))
    dist.destroy_process_group()
    return len(t.role.stages), out


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
    # DualPipeV's stages end on a full backward (some inside an overlapped forward+backward
    # pair) or on a weight-grad action, depending on the rank; 5 micro-batches, more than its
    # 4 stages, so the overlapped steady state runs more than once.
    "dualpipev": [
        pipeline([0, 1, 1, 0], [0, 2, 3, 5, 6], 1, 5, schedule="dualpipev"),
        pipeline([2, 3], [0, 3, 6], 1, 2),
    ],
}


@pytest.mark.parametrize("schedule", list(PLANS))
def test_every_bucket_starts_in_the_action_that_completes_it(schedule, tmp_path):
    plan = make_plan("tiny-llama", PLANS[schedule])
    path = tmp_path / "plan.json"
    plan.save(path)
    results = run_ranks(_starts, plan.num_devices, str(path))
    for rank, (chunks, steps) in enumerate(results):
        for rows, last in steps:
            assert rows, f"rank {rank} has no buckets"
            assert [b for b, _, _ in rows] == list(range(len(rows)))  # `grad_buckets` order
            assert all(got == want for _, got, want in rows), (rank, rows)
            # A bucket per model chunk: a rank running two chunks starts its first chunk's
            # sync while its other chunk still has weight gradients to write (one bucket for
            # both, as the buckets were first built, would wait for the rank's last action).
            assert chunks == 1 or rows[0][1] < last, (rank, rows, last)
