"""Forked gloo workers for the runtime tests, and small plan builders (imported by test_dist_*.py).

Workers are forked from the test process after torch is imported (cheap: no re-import), run with
one thread each (a forked child must not use the parent's OpenMP pool), and are always reaped.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hetpp.runtime.launch import free_port
from hetpp.runtime.options import TrainOptions
from hetpp.runtime.env import DistEnv
from hetpp.runtime.trainer import Activity, RunResult, run
from hetpp.specs import PRESETS, Cluster, PipelinePlan, Plan, StagePlan
from hetpp.specs.plan import load_plan

TIMEOUT_S = 60.0


def cluster(num_devices: int = 8, slow: str | None = None) -> Cluster:
    """`num_devices` A100s on two nodes; with `slow`, the second node has that GPU type."""
    per_node = (num_devices + 1) // 2
    node = {"gpu": "A100-80GB", "gpus_per_node": per_node, "intra_node_GBps": 300}
    nodes = [{**node, "count": 2}] if slow is None else [node, {**node, "gpu": slow}]
    return Cluster.model_validate({"name": "test", "nodes": nodes, "inter_node_GBps": 25})


def pipeline(
    devices: list[int],
    cuts: list[int],
    mbs: int,
    m: int,
    recompute: str = "",
    schedule: str | None = None,
) -> PipelinePlan:
    """A pipeline whose stage i runs on devices[i] with layers [cuts[i], cuts[i+1]); `recompute`
    marks stage i's flag by its i-th letter (r: on, n: off, -: the plan's default); `schedule`
    overrides the plan's."""
    flags = [{"r": True, "n": False}.get(c) for c in recompute.ljust(len(devices), "-")]
    stages = tuple(
        StagePlan(devices=(d,), layers=(a, b), recompute=f)
        for d, a, b, f in zip(devices, cuts[:-1], cuts[1:], flags)
    )
    return PipelinePlan(stages=stages, micro_batch_size=mbs, num_micro_batches=m, schedule=schedule)


def two_pipes_3_2() -> list[PipelinePlan]:
    """Two shapes over devices 0-4 and 6 layers: 3 stages at 2 x 3 samples, 2 at 1 x 4."""
    return [pipeline([0, 1, 2], [0, 2, 4, 6], 2, 3), pipeline([3, 4], [0, 3, 6], 1, 4)]


def three_pipes_3_2_1() -> list[PipelinePlan]:
    """Three shapes over devices 0-5 and 6 layers: 3 stages at 1 x 4, 2 at 2 x 2, 1 at 2 x 1."""
    return [
        pipeline([0, 1, 2], [0, 1, 3, 6], 1, 4),
        pipeline([3, 4], [0, 4, 6], 2, 2),
        pipeline([5], [0, 6], 2, 1),
    ]


def make_plan(
    model: str,
    pipelines: list[PipelinePlan],
    schedule: str = "1f1b",
    seq_len: int = 16,
    precision: str = "fp32",
    cluster_devices: int = 8,
    slow_gpu: str | None = None,
    layer_unit: str = "block",
) -> Plan:
    return Plan(
        global_batch=sum(p.batch for p in pipelines),
        seq_len=seq_len,
        schedule=schedule,
        precision=precision,
        pipelines=tuple(pipelines),
        model=PRESETS[model].model_copy(update={"layer_unit": layer_unit}),
        cluster=cluster(cluster_devices, slow_gpu),
    ).validate_plan()


def _train_rank(rank: int, world: int, init: str, plan_path: str, kw: dict) -> RunResult:
    env = DistEnv(
        rank=rank, world_size=world, local_rank=rank, local_world_size=world, init_method=init
    )
    return run(load_plan(plan_path), TrainOptions(plan=plan_path, **kw), env, Activity())


def _child(q: Any, rank: int, world: int, init: str, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(1)
    try:
        q.put((rank, True, fn(rank, world, init, *args)))
    except BaseException:
        q.put((rank, False, traceback.format_exc()))


def run_ranks(fn: Callable, world: int, *args: Any, timeout_s: float = TIMEOUT_S) -> list[Any]:
    """Fork `world` workers running fn(rank, world, init_method, *args); their return values in
    rank order. Raises with the traceback of the first worker that fails."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_child, args=(q, r, world, init, fn, args)) for r in range(world)]
    results: dict[int, Any] = {}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        while len(results) < world:
            try:
                rank, ok, value = q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"ranks {sorted(set(range(world)) - set(results))} did not "
                    f"finish within {timeout_s} s"
                ) from None
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
        for p in procs:
            p.join(timeout=timeout_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    return [results[r] for r in range(world)]


def train(plan: Plan, tmp: Path, **kw: Any) -> list[RunResult]:
    """Train `plan` on forked ranks (options `kw`); every rank's RunResult."""
    path = tmp / f"plan-{os.getpid()}-{time.monotonic_ns()}.json"
    plan.save(path)
    kw.setdefault("timeout_s", TIMEOUT_S)
    return run_ranks(_train_rank, plan.num_devices, str(path), kw)


def checkpoint_layers(path: Path, num_layers: int = 6) -> list[dict]:
    """The layer files of a checkpoint directory, as `torch.load` reads them."""
    from hetpp.runtime.checkpoint_meta import layer_file

    return [torch.load(path / layer_file(i), weights_only=True) for i in range(num_layers)]
