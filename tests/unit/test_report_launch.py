"""`hetpp plan` prints one torchrun per node, as many processes as the cluster file gives it."""

from __future__ import annotations

from hetpp.report.launch import launch_commands
from hetpp.specs import Cluster


def test_one_command_per_node_in_cluster_file_order():
    cluster = Cluster.model_validate(
        {
            "nodes": [
                {"gpu": "A100-80GB", "gpus_per_node": 2, "intra_node_GBps": 300},
                {"gpu": "V100-16GB", "gpus_per_node": 4, "count": 2, "intra_node_GBps": 150},
            ],
            "inter_node_GBps": 25,
        }
    )
    cmds = launch_commands(cluster, "plan.json", host="h0")
    assert cmds == [
        f"torchrun --nnodes 3 --node-rank {k} --nproc-per-node {n} --master-addr h0 "
        "--master-port 29500 -m hetpp.train --plan plan.json"
        for k, n in ((0, 2), (1, 4), (2, 4))
    ]
