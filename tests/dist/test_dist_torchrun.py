"""One plan across two torchrun launchers on loopback, as two nodes run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from disthelpers import free_port, make_plan, pipeline

from hetpp.report.launch import launch_commands

pytestmark = pytest.mark.dist


def _run_nodes(argvs: list[list[str]], tmp: Path, timeout_s: float = 240) -> list[str]:
    """Start one torchrun per argv (one per "node"); each node's output once all succeeded.
    `timeout_s` only guards against a hang: on a loaded 2-core machine four ranks importing torch
    took over a minute."""
    logs = [tmp / f"node{i}.log" for i in range(len(argvs))]
    files = [log.open("w") for log in logs]
    run = [sys.executable, "-m", "torch.distributed.run"]
    nodes = [
        subprocess.Popen([*run, *a], stdout=f, stderr=subprocess.STDOUT)
        for a, f in zip(argvs, files)
    ]
    try:
        for n in nodes:
            n.wait(timeout=timeout_s)
    finally:
        for n, f in zip(nodes, files):
            n.kill()
            n.wait()
            f.close()
    outs = [log.read_text() for log in logs]
    assert [n.returncode for n in nodes] == [0] * len(nodes), "\n".join(outs)
    report = [line for out in outs for line in out.splitlines() if line.startswith("verify:")]
    assert len(report) == 1 and report[0].endswith("OK"), "\n".join(outs)
    return outs


def test_two_torchrun_nodes_train_one_plan(tmp_path):
    # 4 ranks, 2 per "node" (c10d rendezvous); each pipeline has one stage on each node.
    plan = make_plan(
        "tiny-llama", [pipeline([0, 3], [0, 2, 6], 2, 4), pipeline([1, 2], [0, 4, 6], 2, 2)]
    )
    plan.save(tmp_path / "plan.json")
    args = (
        f"--nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "
        f"127.0.0.1:{free_port()} --rdzv-id hetpp-test -m hetpp.train --plan "
        f"{tmp_path / 'plan.json'} --steps 2 --fp64 --verify --timeout-s 30"
    )
    outs = _run_nodes([args.split()] * 2, tmp_path)
    assert "step 2/2" in "".join(outs)


def test_a_plan_with_unused_devices_starts_as_the_cluster_file_says(tmp_path):
    # Cluster: 2 nodes x 2 GPUs. The plan leaves device 2 (node 1) unused; each node still starts
    # one process per GPU, as `hetpp plan` prints it (static rendezvous, --node-rank).
    plan = make_plan(
        "tiny-gpt",
        [pipeline([0, 3], [0, 2, 6], 2, 2), pipeline([1], [0, 6], 2, 1)],
        cluster_devices=4,
    )
    plan.save(tmp_path / "plan.json")
    cmds = launch_commands(plan.cluster, str(tmp_path / "plan.json"), host="127.0.0.1")
    extra = ["--steps", "2", "--fp64", "--verify", "--timeout-s", "30"]
    port = str(free_port())
    argvs = [c.replace("29500", port).split()[1:] + extra for c in cmds]
    assert [a[a.index("--nproc-per-node") + 1] for a in argvs] == ["2", "2"]
    outs = _run_nodes(argvs, tmp_path)
    assert "hetpp rank 2: device 2 is not in the plan; exiting" in outs[1]
