"""Which device a rank runs on, and the refusal when it is not the one the plan gave it.

With CUDA visible, rank r must find a GPU for every local rank and that GPU must be of the type
the plan's cluster gives device r; otherwise the rank stops with a message naming the rank, the
expected and the found type (it used to fall back to the CPU, or train on the wrong type, without
a word). `--emulate` asks for the CPU explicitly, whatever is installed. A machine without CUDA
runs on the CPU (the development and test set-up): the plan's types are then only labels.
"""

from __future__ import annotations

import re

import torch

from hetpp.runtime.groups import RankMap
from hetpp.specs.errors import SpecError
from hetpp.specs.plan import Plan


def _tokens(name: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", name.lower())) - {"", "nvidia", "tesla", "geforce"}


def type_matches(gpu_type: str, cuda_name: str) -> bool:
    """Whether a CUDA device name (`NVIDIA A100-SXM4-80GB`) is the plan's GPU type (`A100-80GB`):
    every word of the type appears in the name, so A10 is not A100 and 40GB is not 80GB."""
    return _tokens(gpu_type) <= _tokens(cuda_name)


def pick_device(
    plan: Plan, rank: int, local_rank: int, local_world_size: int, emulate: bool
) -> tuple[torch.device, str]:
    """(device, backend) for this rank; SpecError when the GPUs here do not match the plan."""
    if emulate or not torch.cuda.is_available():
        return torch.device("cpu"), "gloo"
    found = torch.cuda.device_count()
    if found < local_world_size:
        raise SpecError(
            f"rank {rank}: this node has {found} GPU(s) for {local_world_size} local ranks; start "
            "one rank per GPU (or pass --emulate to run on the CPU)",
            field="devices",
        )
    name = torch.cuda.get_device_name(local_rank)
    if plan.cluster is not None:
        device_id = RankMap.of(plan).role(rank).device  # rank r plays the plan's r-th device
        expected = plan.cluster.gpu(device_id).name
        if not type_matches(expected, name):
            raise SpecError(
                f"rank {rank}: the plan expects GPU type {expected} (device {device_id}), found "
                f"{name!r} (cuda:{local_rank}); start the ranks in cluster-file order on the "
                "right nodes, or pass --emulate to run on the CPU",
                field="devices",
            )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank), "nccl"
