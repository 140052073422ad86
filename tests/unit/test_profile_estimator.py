"""The estimator against the shipped H200 measurements: calibrate on some widths, test on others."""

import csv
from importlib import resources

import numpy as np
import pytest

from hetpp.profile.estimator import calibrate, estimate_layer, h200_measurements
from hetpp.specs import CATALOG, ModelSpec
from hetpp.specs.model import ModelConfig

H200 = CATALOG["h200"]
ALL_HIDDEN = {1024, 2048, 2560, 4096, 5120, 8192}
SPLITS = [{1024, 4096, 8192}, {2048, 5120}, {1024, 2560, 8192}, {2560, 5120}]


def _block_errors(train: set[int]) -> list[float]:
    cal = calibrate([m for m in h200_measurements(train) if m.mbs >= 2], H200)
    errs = []
    for m in h200_measurements(ALL_HIDDEN - train):
        if m.layer.kind == "block" and m.mbs >= 2:
            f, b = estimate_layer(m.layer, m.seq_len, m.mbs, H200, cal)
            errs.append(abs(f + b - m.fwd_s - m.bwd_s) / (m.fwd_s + m.bwd_s))
    return errs


@pytest.mark.parametrize("train", SPLITS, ids=lambda s: "train-" + "-".join(map(str, sorted(s))))
def test_block_estimate_generalises_to_unseen_widths(train):
    errs = _block_errors(train)
    med = float(np.median(errs))
    print(
        f"calibrated on hidden {sorted(train)}, tested on {sorted(ALL_HIDDEN - train)}: "
        f"median relative error {100 * med:.1f}%, max {100 * max(errs):.1f}% (n={len(errs)})"
    )
    assert med <= 0.10


def test_llama_blocks_with_gpt_calibration():
    """Transfer to another block design (RMSNorm, SwiGLU, GQA), never seen in calibration."""
    text = resources.files("hetpp.data").joinpath("h200_llama_blocks.csv").read_text()
    errs = []
    for r in csv.DictReader(text.splitlines()):
        if int(r["mbs"]) < 2:
            continue
        cfg = ModelConfig(
            family="llama",
            vocab_size=32000,
            hidden_size=int(r["hidden"]),
            num_layers=1,
            num_heads=int(r["heads"]),
            num_kv_heads=int(r["kv_heads"]),
            ffn_hidden_size=int(r["ffn"]),
            max_seq_len=4096,
            position="rope",
            qkv_bias=False,
            dense_bias=False,
        )
        layer = ModelSpec(config=cfg, seq_len=int(r["seq"])).layers[1]
        assert layer.params == int(r["params"])
        f, b = estimate_layer(layer, int(r["seq"]), int(r["mbs"]), H200)
        y = (float(r["fwd_ms"]) + float(r["bwd_ms"])) / 1e3
        errs.append(abs(f + b - y) / y)
    med = float(np.median(errs))
    print(f"llama blocks: median relative error {100 * med:.1f}%, max {100 * max(errs):.1f}%")
    assert med <= 0.15


def test_slower_gpu_is_slower():
    layer = ModelSpec(
        config=ModelConfig(
            family="gpt",
            vocab_size=50257,
            hidden_size=4096,
            num_layers=1,
            num_heads=32,
            ffn_hidden_size=16384,
        ),
        seq_len=2048,
    ).layers[1]
    t = {
        g: sum(estimate_layer(layer, 2048, 4, CATALOG[g])) for g in ("h100-80gb", "a100-80gb", "t4")
    }
    assert t["h100-80gb"] < t["a100-80gb"] < t["t4"]
    # Compute-bound: the time ratio follows the peak-rate ratio within the overhead's share.
    assert t["a100-80gb"] / t["h100-80gb"] == pytest.approx(989.4 / 312, rel=0.15)
