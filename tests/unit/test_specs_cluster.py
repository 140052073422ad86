from pathlib import Path

import pytest

from hetpp.specs import CATALOG, SpecError, load_cluster
from hetpp.specs.cluster import emulate_slowdown

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_catalog_has_the_required_types():
    required = [
        "H200",
        "H100-80GB",
        "A100-80GB",
        "A100-40GB",
        "L40S",
        "A6000",
        "A10",
        "L4",
        "V100-32GB",
        "V100-16GB",
        "T4",
        "RTX-4090",
        "RTX-3090",
    ]
    assert all(name.lower() in CATALOG for name in required)
    assert CATALOG["a100-80gb"].peak_flops_per_s == 312e12
    assert CATALOG["t4"].memory_bytes == 16_000_000_000


def test_device_ids_follow_file_order():
    c = load_cluster(EXAMPLES / "a100-v100.yaml")
    assert c.num_devices == 32
    assert [d.id for d in c.devices] == list(range(32))
    assert c.devices[0].gpu.name == "A100-80GB" and c.devices[15].gpu.name == "A100-80GB"
    assert c.devices[16].gpu.name == "V100-32GB"
    assert [c.devices[i].node for i in (0, 7, 8, 15, 16, 31)] == [0, 0, 1, 1, 2, 3]


def test_custom_type_and_override(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(
        "gpu_types:\n"
        "  - {name: MyGPU, bf16_tflops: 100, memory_gb: 24, mem_bw_GBps: 900}\n"
        "  - {name: T4, bf16_tflops: 60, memory_gb: 16, mem_bw_GBps: 300}\n"
        "nodes:\n"
        "  - {gpu: mygpu, gpus_per_node: 2, intra_node_GBps: 32}\n"
        "  - {gpu: T4, gpus_per_node: 1, count: 3, intra_node_GBps: 16}\n"
        "inter_node_GBps: 10\n"
    )
    c = load_cluster(f)
    assert c.gpu(0).name == "MyGPU" and c.gpu(2).bf16_tflops == 60
    assert c.num_devices == 5 and c.devices[4].node == 3


def test_emulation_factor_is_speed_ratio(small_cluster):
    assert emulate_slowdown(small_cluster, 0) == 1.0
    assert emulate_slowdown(small_cluster, 2) == pytest.approx(312 / 125)


def test_unknown_gpu_type_names_the_field(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(
        "nodes:\n  - {gpu: B300, gpus_per_node: 2, intra_node_GBps: 3}\ninter_node_GBps: 1\n"
    )
    with pytest.raises(SpecError, match=r"nodes\[0\]\.gpu: unknown GPU type 'B300'"):
        load_cluster(f)
