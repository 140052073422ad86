"""Layer-time estimates for catalog GPUs: a roofline sum calibrated on measured data.

For a layer call with F FLOPs and B bytes of activation traffic on a GPU with peak rate P and
memory bandwidth W, the estimate is

    t = a * F / P  +  b * B / W  +  c

with (a, b, c) fitted per layer kind and direction (forward, backward) by least squares on
*relative* error over measured rows. `a` is 1 / (sustained matmul efficiency), `b` folds the
elementwise passes (norms, activations, softmax) over the activation bytes, `c` is the launch
overhead. The shipped calibration uses the H200 GPT rows (`hetpp/data/h200_gpt_layers.csv`); other
GPUs reuse it with their own P and W, which is the usual transfer assumption of roofline models.
"""

from __future__ import annotations

import csv
from functools import cache
from importlib import resources
from typing import NamedTuple

import numpy as np

from hetpp.specs.catalog import CATALOG, GpuType
from hetpp.specs.model import LayerSpec, ModelConfig, ModelSpec

CSV_KIND = {"block": "block", "embedding": "embedding", "lm_head": "head"}


class Coefs(NamedTuple):
    """t = compute * F/P + memory * B/W + overhead_s."""

    compute: float
    memory: float
    overhead_s: float


class Calibration(NamedTuple):
    """Coefficients per layer kind, forward and backward."""

    fwd: dict[str, Coefs]
    bwd: dict[str, Coefs]


class Measurement(NamedTuple):
    """One measured layer call, the input to `calibrate`."""

    layer: LayerSpec
    seq_len: int
    mbs: int
    fwd_s: float
    bwd_s: float


def features(layer: LayerSpec, seq_len: int, mbs: float, gpu: GpuType) -> tuple[float, float]:
    """(F / P, B / W) of one forward call: ideal compute and memory seconds."""
    flops = layer.fwd_flops_per_token * seq_len * mbs
    traffic = (layer.saved_bytes_per_sample + layer.send_bytes_per_sample) * mbs
    return flops / gpu.peak_flops_per_s, traffic / gpu.mem_bw_bytes_per_s


def _fit(x: np.ndarray, y: np.ndarray) -> Coefs:
    """Non-negative least squares on relative error, by dropping negative terms and refitting."""
    active = [0, 1, 2]
    while True:
        a = x[:, active] / y[:, None]
        sol = np.linalg.lstsq(a, np.ones(len(y)), rcond=None)[0]
        if (sol >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(sol)))
    coef = np.zeros(3)
    coef[active] = np.maximum(sol, 0)
    return Coefs(*coef.tolist())


def calibrate(rows: list[Measurement], gpu: GpuType) -> Calibration:
    """Fit (a, b, c) per layer kind and direction from measurements on `gpu`."""
    fwd, bwd = {}, {}
    for kind in {r.layer.kind for r in rows}:
        sel = [r for r in rows if r.layer.kind == kind]
        feats = np.array([features(r.layer, r.seq_len, r.mbs, gpu) for r in sel])
        ones = np.ones((len(sel), 1))
        fwd[kind] = _fit(np.hstack([feats, ones]), np.array([r.fwd_s for r in sel]))
        # Backward does twice the forward's matmul FLOPs.
        xb = np.hstack([feats * [2.0, 1.0], ones])
        bwd[kind] = _fit(xb, np.array([r.bwd_s for r in sel]))
    return Calibration(fwd, bwd)


def h200_measurements(hidden_sizes: set[int] | None = None) -> list[Measurement]:
    """The shipped H200 GPT measurements (optionally only some hidden sizes)."""
    text = resources.files("hetpp.data").joinpath("h200_gpt_layers.csv").read_text()
    out = []
    for r in csv.DictReader(text.splitlines()):
        h = int(r["hidden"])
        if hidden_sizes is not None and h not in hidden_sizes:
            continue
        cfg = ModelConfig(
            family="gpt",
            vocab_size=50257,
            hidden_size=h,
            num_layers=1,
            num_heads=int(r["heads"]),
            ffn_hidden_size=4 * h,
            max_seq_len=int(r["seq"]),
            position="rope",
        )
        spec = ModelSpec(config=cfg, seq_len=int(r["seq"]))
        layer = next(x for x in spec.layers if x.kind == CSV_KIND[r["layer"]])
        out.append(
            Measurement(
                layer,
                spec.seq_len,
                int(r["mbs"]),
                float(r["fwd_ms"]) / 1e3,
                float(r["bwd_ms"]) / 1e3,
            )
        )
    return out


@cache
def default_calibration() -> Calibration:
    """Calibration on all shipped H200 GPT rows with micro-batch size >= 2 (mbs 1 of narrow
    layers is launch-bound noise that would distort the fit)."""
    rows = [m for m in h200_measurements() if m.mbs >= 2]
    return calibrate(rows, CATALOG["h200"])


def estimate_layer(
    layer: LayerSpec, seq_len: int, mbs: float, gpu: GpuType, cal: Calibration | None = None
) -> tuple[float, float]:
    """(fwd_s, bwd_s) of one layer call of `mbs` samples on `gpu`."""
    cal = cal or default_calibration()
    fc, fm = features(layer, seq_len, mbs, gpu)
    f, b = cal.fwd[layer.kind], cal.bwd[layer.kind]
    fwd = f.compute * fc + f.memory * fm + f.overhead_s
    bwd = b.compute * 2 * fc + b.memory * fm + b.overhead_s
    return fwd, bwd
