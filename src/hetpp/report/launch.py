"""The command that starts a plan on each node of its cluster (`hetpp plan` prints them).

One torchrun per node, node K in cluster-file order, as many processes as the node has GPUs:
rank r is then cluster device r (static rendezvous: `--node-rank` fixes the order), and ranks
whose device the plan leaves unused exit at once (`runtime.groups.plan_rank`).
"""

from __future__ import annotations

from collections import Counter

from hetpp.specs.cluster import Cluster

PORT = 29500


def launch_commands(cluster: Cluster, plan_path: str, host: str = "NODE0_HOST") -> list[str]:
    """One command per node of `cluster`, in node order."""
    per_node = Counter(d.node for d in cluster.devices)
    return [
        f"torchrun --nnodes {len(per_node)} --node-rank {node} --nproc-per-node {n} "
        f"--master-addr {host} --master-port {PORT} -m hetpp.train --plan {plan_path}"
        for node, n in sorted(per_node.items())
    ]
