"""The estimator against the shipped H200 measurements: calibrate on some widths, test on others."""

import csv
from importlib import resources

import numpy as np
import pytest

from hetpp.profile.estimator import (
    STREAM_EFFICIENCY,
    _lstsq,
    calibrate,
    default_calibration,
    estimate_layer,
    features,
    h200_measurements,
    traffic_bytes,
    unpadded_head_efficiency,
)
from hetpp.specs import CATALOG, ModelSpec
from hetpp.specs.model import ModelConfig
from hetpp.specs.presets import PRESETS

H200 = CATALOG["h200"]
ALL_HIDDEN = {1024, 2048, 2560, 4096, 5120, 8192}
SPLITS = [{1024, 4096, 8192}, {2048, 5120}, {1024, 2560, 8192}, {2560, 5120}]


def _block_errors(train: set[int]) -> list[float]:
    cal = calibrate([m for m in h200_measurements(train) if m.mbs >= 2], H200)
    errs = []
    for m in h200_measurements(ALL_HIDDEN - train):
        if m.layer.kind == "block" and m.mbs >= 2:
            f, b = estimate_layer(m.layer, m.model, m.mbs, H200, cal)
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
        spec = ModelSpec(config=cfg, seq_len=int(r["seq"]))
        layer = spec.layers[1]
        assert layer.params == int(r["params"])
        f, b = estimate_layer(layer, spec, int(r["mbs"]), H200)
        y = (float(r["fwd_ms"]) + float(r["bwd_ms"])) / 1e3
        errs.append(abs(f + b - y) / y)
    med = float(np.median(errs))
    print(f"llama blocks: median relative error {100 * med:.1f}%, max {100 * max(errs):.1f}%")
    assert med <= 0.15


def test_slower_gpu_is_slower():
    spec = ModelSpec(
        config=ModelConfig(
            family="gpt",
            vocab_size=50257,
            hidden_size=4096,
            num_layers=1,
            num_heads=32,
            ffn_hidden_size=16384,
        ),
        seq_len=2048,
    )
    t = {
        g: sum(estimate_layer(spec.layers[1], spec, 4, CATALOG[g]))
        for g in ("h100-80gb", "a100-80gb", "t4")
    }
    assert t["h100-80gb"] < t["a100-80gb"] < t["t4"]
    # Compute-bound: the time ratio follows the sustained-rate ratio within the overhead's share.
    h100, a100 = CATALOG["h100-80gb"], CATALOG["a100-80gb"]
    rate = h100.peak_flops_per_s * h100.compute_transfer / a100.peak_flops_per_s
    assert t["a100-80gb"] / t["h100-80gb"] == pytest.approx(rate, rel=0.15)


def _cross_entropy_s(spec: ModelSpec, mbs: int, gpu) -> float:
    """Datasheet-bandwidth time of the cross-entropy's passes over the logits, both directions
    (4-byte loss, logits upcast from the activation dtype): the floor a head cannot beat."""
    n = spec.seq_len * mbs * spec.config.vocab_size
    d = spec.dtype_bytes
    return n * (d + (d + 4) + 8 + 16 + (d + 4)) / gpu.mem_bw_bytes_per_s


@pytest.mark.parametrize("gpu", sorted(CATALOG), ids=str)
def test_head_costs_its_flop_share_of_a_block_plus_its_loss(gpu):
    """Issue 12, done-when 2: on every GPU, for every preset, the head costs 0.8-1.5x its FLOP
    share of a block plus its cross-entropy's memory time. Launch constants are left out of both
    sides: the tiny presets are launch-bound on any GPU, where no FLOP share means anything."""
    cal, g = default_calibration(), CATALOG[gpu]
    for name, cfg in PRESETS.items():
        spec = ModelSpec(config=cfg, seq_len=min(cfg.max_seq_len, 2048))
        block, head = spec.layers[1], spec.layers[-1]
        for mbs in (1, 4):
            t_block = sum(estimate_layer(block, spec, mbs, g)) - _overheads(cal, "block")
            t_head = sum(estimate_layer(head, spec, mbs, g)) - _overheads(cal, "head")
            share = head.fwd_flops_per_token / block.fwd_flops_per_token
            ratio = t_head / (share * t_block + _cross_entropy_s(spec, mbs, g))
            assert 0.8 <= ratio <= 1.5, (name, mbs, ratio)


def _overheads(cal, kind: str) -> float:
    return cal.fwd[kind].overhead_s + cal.bwd[kind].overhead_s


def test_unpadded_h200_head_is_the_odd_vocabulary_gemm():
    """The shipped lm_head rows (vocab 50257) stay as evidence: after their norm and loss passes,
    their GEMM ran at 10-14% of peak, where the fitted blocks reach over 65%."""
    rows = [m for m in h200_measurements() if m.layer.kind == "head" and m.mbs >= 2]
    eff = [unpadded_head_efficiency(m, H200) for m in rows]
    assert min(eff) >= 0.10 and max(eff) <= 0.14
    cal = default_calibration()
    assert 1 / cal.fwd["block"].compute > 0.65 and 1 / cal.bwd["block"].compute > 0.65
    # The estimate is the aligned head's: several times faster than the unpadded measurement.
    for m in rows:
        assert sum(estimate_layer(m.layer, m.model, m.mbs, H200)) < 0.4 * (m.fwd_s + m.bwd_s)


def test_embedding_is_a_memory_bound_gather():
    """No FLOPs; the forward moves the looked-up rows, the backward the whole gradient table; the
    fit stays within 40% of every H200 embedding row at micro-batch >= 2."""
    rows = [m for m in h200_measurements() if m.layer.kind == "embedding" and m.mbs >= 2]
    for m in rows:
        compute, fwd_mem, bwd_mem = features(m.layer, m.model, m.mbs, H200)
        assert compute == 0 and bwd_mem > fwd_mem
        f, b = estimate_layer(m.layer, m.model, m.mbs, H200)
        assert f + b == pytest.approx(m.fwd_s + m.bwd_s, rel=0.4)
    m = rows[0]
    fwd, bwd = traffic_bytes(m.layer, m.model, 2)
    h, s = m.model.config.hidden_size, m.model.seq_len
    assert fwd == 2 * 2 * s * h * 2  # two samples, rows read and written, bf16
    assert bwd == m.layer.stored_params * 2 + 2 * 3 * s * h * 2
    assert 0.8 < STREAM_EFFICIENCY < 0.95


def test_fp32_plans_are_priced_at_the_fp32_rate():
    """Issue 12: an fp32 model's matmuls run at the datasheet FP32 rate (TF32 off), not bf16."""
    from hetpp.cost.compute import CostModel
    from hetpp.specs import Cluster, TrainSpec

    a100 = CATALOG["a100-80gb"]
    assert a100.matmul_flops_per_s(2) == 312e12 and a100.matmul_flops_per_s(4) == 19.5e12
    cluster = Cluster.model_validate(
        {
            "nodes": [{"gpu": "A100-80GB", "gpus_per_node": 1, "intra_node_GBps": 300}],
            "inter_node_GBps": 25,
        }
    )
    blocks = {}
    for precision, d in (("bf16", 2), ("fp32", 4)):
        spec = ModelSpec(config=PRESETS["gpt3-6.7b"], seq_len=2048, dtype_bytes=d)
        cm = CostModel(spec, TrainSpec(global_batch=8, precision=precision), cluster)
        costs = cm.layer_costs(a100, 4)
        blocks[precision] = costs.fwd(1, 2) + costs.bwd(1, 2)
    # Compute-bound: the ratio approaches 312 / 19.5 = 16 (memory passes only double).
    assert 12 < blocks["fp32"] / blocks["bf16"] < 16


def test_a_type_without_an_fp32_rate_keeps_its_only_rate():
    from hetpp.specs import GpuType

    g = GpuType(name="Mine", bf16_tflops=100, memory_gb=24, mem_bw_GBps=900)
    assert g.matmul_flops_per_s(4) == g.matmul_flops_per_s(2) == 100e12


def test_the_fit_solves_least_squares_without_lapack():
    # `_lstsq` replaces np.linalg.lstsq, whose last bits depend on the CPU's BLAS kernels; it
    # must still be least squares: an exact system is solved exactly, an overdetermined one
    # agrees with LAPACK to rounding (float64 on a well-conditioned matrix)
    assert _lstsq([[1.0, 0.0], [0.0, 2.0]], [3.0, 4.0]) == [3.0, 2.0]
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.5, 2.0, (12, 3)), rng.uniform(0.5, 2.0, 12)
    want = np.linalg.lstsq(a, b, rcond=None)[0]
    got = _lstsq(a.T.tolist(), b.tolist())
    assert np.allclose(got, want, rtol=1e-10, atol=0)
    # and its residual is orthogonal to the columns (the normal equations)
    assert np.abs(a.T @ (b - a @ np.array(got))).max() < 1e-12
