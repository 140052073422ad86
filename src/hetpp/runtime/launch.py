"""Local launcher: one `python -m hetpp.train` process per plan device on this machine.

It sets the same environment torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), so a
rank runs identically under both. When a rank fails, the others stop by themselves within the
timeout (their next collective or P2P fails, or times out); the launcher gives them that long, then
kills what is left and exits non-zero. No torch import here: the launcher only watches processes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from hetpp.runtime.env import DistEnv
from hetpp.runtime.options import TrainOptions

GRACE_S = 10.0
"""Extra seconds past the timeout before surviving ranks are killed."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(opts: TrainOptions, world_size: int) -> int:
    """Run all ranks here; returns 0 when every rank succeeded, else the first failure's code."""
    port = str(free_port())
    cmd = [sys.executable, "-m", "hetpp.train", *opts.to_argv()]
    procs: list[subprocess.Popen] = []
    try:
        for r in range(world_size):
            rank = DistEnv(rank=r, world_size=world_size, local_rank=r, local_world_size=world_size)
            env = {
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                **rank.to_environ(),
            }
            procs.append(subprocess.Popen(cmd, env=env))
        return _watch(procs, opts.timeout_s + GRACE_S)
    finally:
        _stop(procs)


def _watch(procs: list[subprocess.Popen], grace_s: float) -> int:
    first: int | None = None  # exit code of the first failure seen
    deadline = float("inf")
    while True:
        codes = [p.poll() for p in procs]
        if first is None and any(c not in (None, 0) for c in codes):
            first = next(c for c in codes if c not in (None, 0))
            deadline = time.monotonic() + grace_s
        if all(c is not None for c in codes):
            break
        if time.monotonic() > deadline:
            alive = [r for r, c in enumerate(codes) if c is None]
            print(
                f"hetpp train: ranks {alive} still running {grace_s:g} s after a rank failed; "
                "stopping them",
                file=sys.stderr,
                flush=True,
            )
            break
        time.sleep(0.1)
    if first is None:
        return 0
    # Ranks that fail together (one lost, the others noticing) exit within milliseconds of each
    # other; the per-rank messages above say which one failed first and why.
    failed = ", ".join(f"rank {r}: {c}" for r, c in enumerate(codes) if c not in (None, 0))
    print(f"hetpp train: failed (exit codes {failed})", file=sys.stderr, flush=True)
    return first if first > 0 else 1


def _stop(procs: list[subprocess.Popen]) -> None:
    """Terminate and reap every rank still running (also on Ctrl-C in the launcher)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
