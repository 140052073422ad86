"""A rank refuses a GPU of another type than the plan's, or a node with too few GPUs (issue 9);
the CUDA query is faked, so this runs on CPU."""

from __future__ import annotations

import pytest
import torch
from hostile_cases import good_plan

from hetpp.runtime.devices import pick_device, type_matches
from hetpp.specs import Plan, SpecError

PLAN = Plan.model_validate(good_plan())  # devices 0-1: A100-80GB, 2-3: T4


@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend this machine has the given CUDA devices."""

    def install(*names: str) -> list[int]:
        chosen: list[int] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(names))
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: names[i])
        monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
        return chosen

    return install


@pytest.mark.parametrize(
    ("gpu_type", "cuda_name", "same"),
    [
        ("A100-80GB", "NVIDIA A100-SXM4-80GB", True),
        ("A100-80GB", "NVIDIA A100 80GB PCIe", True),
        ("A100-40GB", "NVIDIA A100-SXM4-80GB", False),
        ("A10", "NVIDIA A100-SXM4-80GB", False),
        ("A10", "NVIDIA A10", True),
        ("V100-16GB", "Tesla V100-SXM2-16GB", True),
        ("RTX-4090", "NVIDIA GeForce RTX 4090", True),
        ("H100-80GB", "NVIDIA H100 80GB HBM3", True),
        ("H200", "NVIDIA H100 80GB HBM3", False),
        ("T4", "Tesla T4", True),
    ],
)
def test_type_matches(gpu_type, cuda_name, same):
    assert type_matches(gpu_type, cuda_name) is same


def test_the_right_gpu_is_used(fake_cuda):
    chosen = fake_cuda("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB")
    device, backend = pick_device(PLAN, rank=1, local_rank=1, local_world_size=2, emulate=False)
    assert (device, backend, chosen) == (torch.device("cuda", 1), "nccl", [1])


def test_a_gpu_of_another_type_is_refused_naming_rank_expected_and_found(fake_cuda):
    fake_cuda("Tesla T4", "Tesla T4")
    with pytest.raises(SpecError) as e:
        pick_device(PLAN, rank=1, local_rank=1, local_world_size=2, emulate=False)
    msg = str(e.value)
    assert "rank 1" in msg and "expects GPU type A100-80GB" in msg and "found 'Tesla T4'" in msg


def test_too_few_gpus_is_refused_not_a_cpu_fallback(fake_cuda):
    fake_cuda("Tesla T4")
    with pytest.raises(SpecError, match="rank 3: this node has 1 GPU"):
        pick_device(PLAN, rank=3, local_rank=1, local_world_size=2, emulate=False)


def test_emulation_runs_on_the_cpu_explicitly(fake_cuda):
    chosen = fake_cuda("Tesla T4")
    device, backend = pick_device(PLAN, rank=0, local_rank=0, local_world_size=4, emulate=True)
    assert (device.type, backend, chosen) == ("cpu", "gloo", [])


def test_no_cuda_runs_on_the_cpu(fake_cuda):
    fake_cuda()
    assert pick_device(PLAN, 0, 0, 4, emulate=False) == (torch.device("cpu"), "gloo")
