"""A rank that dies or hangs makes every other rank stop, non-zero, naming what it was doing."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time

import pytest
import torch
from disthelpers import free_port, make_plan, pipeline

from hetpp.runtime import checkpoint
from hetpp.runtime.options import TrainOptions
from hetpp.runtime.env import DistEnv
from hetpp.runtime.trainer import main

pytestmark = pytest.mark.dist


def _worker(rank: int, world: int, init: str, opts: TrainOptions, err_path: str) -> None:
    torch.set_num_threads(1)
    sys.stderr = open(err_path, "w", buffering=1)  # noqa: SIM115 - lives as long as the process
    env = DistEnv(
        rank=rank, world_size=world, local_rank=rank, local_world_size=world, init_method=init
    )
    sys.exit(main(opts, env))


def _wait_for_steps(path, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} steps after {timeout_s} s")


@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_a_lost_rank_stops_the_others(fault, tmp_path):
    plan = make_plan("tiny-gpt", [pipeline([0, 1], [0, 3, 6], 2, 2), pipeline([2], [0, 6], 2, 2)])
    plan.save(tmp_path / "plan.json")
    # A dead peer must be noticed at once (closed sockets): its case runs with a collective
    # timeout far beyond the join below, so waiting for the timeout fails the test. A silent
    # (stopped) peer is noticed by the timeout.
    timeout_s = 120.0 if fault == "kill" else 6.0
    join_s = 60.0 if fault == "kill" else timeout_s + 30
    metrics, ckpt = tmp_path / "m.jsonl", tmp_path / "ckpt"
    opts = TrainOptions(
        plan=str(tmp_path / "plan.json"),
        steps=10**6,
        timeout_s=timeout_s,
        metrics=str(metrics),
        checkpoint_dir=str(ckpt),
        checkpoint_every=2,
    )
    ctx, init = mp.get_context("fork"), f"tcp://127.0.0.1:{free_port()}"
    errs = [tmp_path / f"rank{r}.err" for r in range(3)]
    procs = [ctx.Process(target=_worker, args=(r, 3, init, opts, str(errs[r]))) for r in range(3)]
    try:
        for p in procs:
            p.start()
        _wait_for_steps(metrics, 5, timeout_s=60)
        os.kill(procs[1].pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        for r in (0, 2):
            procs[r].join(timeout=join_s)
            assert procs[r].exitcode not in (None, 0), f"rank {r} did not stop"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    for r in (0, 2):
        text = errs[r].read_text()
        assert f"hetpp rank {r}: failed while step " in text, text
    # Checkpoints written before the loss are complete and readable; a partial one is never used.
    done = checkpoint.latest(ckpt)
    assert done is not None and checkpoint.read_meta(done).step % 2 == 0
    assert all((done / f"layer_{i:04d}.pt").exists() for i in range(plan.layer_list_len))
