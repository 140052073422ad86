"""CUDA device names map to catalog GPU types (`hetpp profile`'s default --gpu-name)."""

import pytest

from hetpp.specs.catalog import CATALOG, catalog_name_for_device

NAMES = {
    "NVIDIA H200": "H200",
    "NVIDIA H100 80GB HBM3": "H100-80GB",
    "NVIDIA A100-SXM4-80GB": "A100-80GB",
    "NVIDIA A100 80GB PCIe": "A100-80GB",
    "NVIDIA A100-SXM4-40GB": "A100-40GB",
    "NVIDIA A100-PCIE-40GB": "A100-40GB",
    "NVIDIA L40S": "L40S",
    "NVIDIA RTX A6000": "A6000",
    "NVIDIA A10": "A10",
    "NVIDIA L4": "L4",
    "Tesla V100-SXM2-32GB": "V100-32GB",
    "Tesla V100-SXM2-16GB": "V100-16GB",
    "Tesla V100-PCIE-16GB": "V100-16GB",
    "Tesla T4": "T4",
    "NVIDIA GeForce RTX 4090": "RTX-4090",
    "NVIDIA GeForce RTX 3090": "RTX-3090",
}
# Parts the catalog has no entry for: other memory, clocks or bandwidth than its look-alikes.
UNKNOWN = [
    "NVIDIA H100 PCIe",
    "NVIDIA H100 NVL",
    "NVIDIA A10G",
    "Tesla V100S-PCIE-32GB",
    "NVIDIA L40",
    "NVIDIA GeForce RTX 4080",
    "NVIDIA B200",
    "AMD Instinct MI300X",
]


@pytest.mark.parametrize("device, name", NAMES.items())
def test_device_names_map_to_catalog_types(device, name):
    assert catalog_name_for_device(device) == name
    assert name.lower() in CATALOG


@pytest.mark.parametrize("device", UNKNOWN)
def test_parts_without_an_entry_map_to_none(device):
    assert catalog_name_for_device(device) is None


def test_every_catalog_type_is_reachable():
    assert set(NAMES.values()) == {t.name for t in CATALOG.values()}


def test_profile_names_rows_after_the_devices_catalog_type(monkeypatch):
    import torch

    from hetpp.cli.profile import _default_gpu_name
    from hetpp.specs.errors import SpecError

    assert _default_gpu_name(torch.device("cpu")) == "CPU"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100-SXM4-80GB")
    assert _default_gpu_name(torch.device("cuda", 0)) == "A100-80GB"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA B200")
    with pytest.raises(SpecError, match=r"--gpu-name: this device \('NVIDIA B200'\) matches no"):
        _default_gpu_name(torch.device("cuda", 0))
