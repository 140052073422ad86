"""Shared fixtures: small clusters and the repository's example files."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetpp.specs import Cluster

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def small_cluster() -> Cluster:
    """Two A100-80GB in one node, four V100-16GB in another."""
    return Cluster.model_validate(
        {
            "name": "small",
            "nodes": [
                {"gpu": "A100-80GB", "gpus_per_node": 2, "intra_node_GBps": 300},
                {"gpu": "V100-16GB", "gpus_per_node": 4, "intra_node_GBps": 150},
            ],
            "inter_node_GBps": 12.5,
            "inter_node_latency_us": 10,
        }
    )
