"""One plan across two torchrun launchers on loopback, as two nodes run it (c10d rendezvous)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from disthelpers import free_port, make_plan, pipeline

pytestmark = pytest.mark.dist


def test_two_torchrun_nodes_train_one_plan(tmp_path):
    # 4 ranks, 2 per "node"; each pipeline has one stage on each node.
    plan = make_plan(
        "tiny-llama", [pipeline([0, 3], [0, 2, 6], 2, 4), pipeline([1, 2], [0, 4, 6], 2, 2)]
    )
    plan.save(tmp_path / "plan.json")
    endpoint = f"127.0.0.1:{free_port()}"
    args = (
        f"--nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint {endpoint} "
        f"--rdzv-id hetpp-test -m hetpp.train --plan {tmp_path / 'plan.json'} --steps 2 "
        "--fp64 --verify --timeout-s 30"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", *args.split()]
    logs = [tmp_path / f"node{i}.log" for i in range(2)]
    files = [log.open("w") for log in logs]
    nodes = [subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT) for f in files]
    try:
        for n in nodes:
            n.wait(timeout=60)
    finally:
        for n, f in zip(nodes, files):
            n.kill()
            n.wait()
            f.close()
    outs = [log.read_text() for log in logs]
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(outs)
    report = [line for out in outs for line in out.splitlines() if line.startswith("verify:")]
    assert len(report) == 1 and report[0].endswith("OK"), "\n".join(outs)
    assert "step 2/2" in "".join(outs)
