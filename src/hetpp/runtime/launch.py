"""Local launcher: one `python -m hetpp.train` process per plan device on this machine.

It sets the same environment torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), so a
rank runs identically under both. When a rank fails, the others stop by themselves within the
timeout (their next collective or P2P fails, or times out); the launcher gives them that long, then
kills what is left and exits non-zero. SIGTERM, SIGHUP or SIGINT to the launcher (`kill PID`,
`Popen.terminate()`, a closed terminal, Ctrl-C) stops every rank and exits 128 + the signal; a
launcher killed outright (SIGKILL) takes its ranks with it (Linux: PR_SET_PDEATHSIG). A rank
stopped while writing a checkpoint leaves only a temporary directory that is never read. No torch
import here: the launcher only watches processes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from hetpp.runtime.env import DistEnv
from hetpp.runtime.options import TrainOptions
from hetpp.runtime.preflight import LAUNCHED

GRACE_S = 10.0
"""Extra seconds past the timeout before surviving ranks are killed."""
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""Signals that stop the whole run, not just the launcher."""
_PR_SET_PDEATHSIG = 1


class Stopped(Exception):
    """The launcher received one of FORWARDED."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise Stopped(signum)

    old = {s: signal.signal(s, handler) for s in FORWARDED}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _die_with_parent() -> None:
    """In each rank before exec: the kernel sends SIGKILL if the launcher dies (Linux only)."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


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
        with _stop_on_signals():
            return _start_and_watch(cmd, port, world_size, opts.timeout_s + GRACE_S, procs)
    except Stopped as e:
        print(f"hetpp train: {e}: stopping every rank", file=sys.stderr, flush=True)
        return 128 + e.signum
    finally:
        _stop(procs)


def _start_and_watch(
    cmd: list[str], port: str, world_size: int, grace_s: float, procs: list[subprocess.Popen]
) -> int:
    for r in range(world_size):
        rank = DistEnv(rank=r, world_size=world_size, local_rank=r, local_world_size=world_size)
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            **rank.to_environ(),
            LAUNCHED: "1",
        }
        procs.append(subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent))
    return _watch(procs, grace_s)


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
