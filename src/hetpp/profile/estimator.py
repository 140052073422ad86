"""Layer-time estimates for catalog GPUs: a roofline sum calibrated on measured data.

For a layer call with F FLOPs and B bytes of memory traffic on a GPU with peak rate P and memory
bandwidth W, the estimate is

    t = a * F / P  +  b * B / W  +  c

per layer kind and direction (forward, backward). `a` is 1 / (sustained matmul efficiency), `b`
the inverse efficiency of the memory-bound passes over B, `c` the launch overhead. What B counts
depends on what the layer is (`traffic_bytes`):

- **block**: its activation bytes (the elementwise passes of norms, activations, softmax scale
  with them); (a, b, c) fitted by least squares on relative error over the shipped H200 GPT
  blocks (`hetpp/data/h200_gpt_layers.csv`).
- **embedding**: a memory-bound gather. Forward reads the looked-up rows and writes them
  (positions: one more gather and an add); backward zero-fills the gradient table, then
  scatter-adds the incoming gradient into it. (b, c) fitted on the H200 embedding rows.
- **head** (final norm + LM head + cross-entropy): the LM head GEMM at the blocks' fitted matmul
  efficiency, plus the norm and the cross-entropy as memory-bound passes over their bytes at the
  streaming efficiency the H200's device copy reached (`STREAM_EFFICIENCY`). Not fitted on the
  H200 `lm_head` rows: those time `nn.Linear(h, 50257)`, an odd vocabulary whose GEMM misses the
  tensor-core fast path (its GEMM ran at 11-13% of peak once the norm and loss passes are taken
  out, where the blocks reach 67-73%). Fitted on, they priced every head, Llama's aligned 32000
  and 128256 included, at that rate (2.5-15 blocks per head on an A100). They stay in the data as
  the measurement of an unpadded head (`unpadded_head_efficiency`, read with `vocab_multiple=1`,
  as the rows were measured); the estimate is that of a head whose vocabulary is padded to a
  multiple of the GEMM tile, as Megatron and llm-foundry pad it and as hetpp's runtime builds it
  (`ModelConfig.vocab_multiple`, default 128: its FLOPs and logits writes are those of
  `padded_vocab`).

Other GPUs reuse the H200 coefficients with their own P and W, the usual transfer assumption of
roofline models; P is scaled by the type's `compute_transfer` where published throughput says
the assumption is off (H100 and V100: 0.8; `bench/published.py` sets every type it could check
beside published runs, docs/benchmarks-cost.md says what each type's figures rest on).
"""

from __future__ import annotations

import csv
import json
import math
from functools import cache
from importlib import resources
from typing import NamedTuple

import numpy as np

from hetpp.specs.catalog import CATALOG, GpuType
from hetpp.specs.model import LayerSpec, ModelConfig, ModelSpec

CSV_KIND = {"block": "block", "embedding": "embedding", "lm_head": "head"}
FITTED_KINDS = ("block", "embedding")
LOSS_BYTES = 4
"""The runtime computes the cross-entropy in fp32 (half-precision logits are upcast)."""


def _stream_efficiency() -> float:
    """Measured H200 device-to-device copy (read + write) over its datasheet bandwidth."""
    info = json.loads(resources.files("hetpp.data").joinpath("h200_info.json").read_text())
    return info["d2d_GBps"] / CATALOG["h200"].mem_bw_GBps


STREAM_EFFICIENCY = _stream_efficiency()
"""Fraction of datasheet bandwidth a streaming kernel reaches (0.88 on the H200)."""


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
    model: ModelSpec
    """The model the layer belongs to (sequence length, dtype, vocabulary)."""
    mbs: int
    fwd_s: float
    bwd_s: float


def traffic_bytes(layer: LayerSpec, model: ModelSpec, mbs: float) -> tuple[float, float]:
    """(forward, backward) bytes of memory traffic of one call of `mbs` samples."""
    d, tokens = model.dtype_bytes, model.seq_len * mbs
    h = model.config.hidden_size
    if layer.kind == "block":
        act = (layer.saved_bytes_per_sample + layer.send_bytes_per_sample) * mbs
        return act, act
    if layer.kind == "embedding":
        gathers = 2 if model.config.position == "learned" else 1
        # Per gather: read the rows, write them; learned positions add an add (read 2, write 1).
        fwd = tokens * h * d * (2 * gathers + 3 * (gathers - 1))
        # Zero-fill the gradient table(s), then read the gradient and update the rows it names.
        bwd = layer.stored_params * d + tokens * h * d * 3 * gathers
        return fwd, bwd
    logits = tokens * model.config.vocab_size
    padded = tokens * model.config.padded_vocab
    upcast = d + LOSS_BYTES if d < LOSS_BYTES else 0
    norm_fwd, norm_bwd = 2 * tokens * h * d, 3 * tokens * h * d
    # Forward: the GEMM writes the padded logits, the upcast copies the real ones to fp32,
    # log-softmax reads them (max and sum in one pass) and writes its output. Backward: the loss
    # writes its gradient, log-softmax's backward reads it and its output and writes the logits'
    # gradient, which is cast back to the activation dtype (and padded) for the GEMM.
    fwd = padded * d + logits * (upcast + 2 * LOSS_BYTES) + norm_fwd
    bwd = logits * (LOSS_BYTES + 3 * LOSS_BYTES + upcast) + norm_bwd
    return fwd, bwd


def features(
    layer: LayerSpec, model: ModelSpec, mbs: float, gpu: GpuType
) -> tuple[float, float, float]:
    """(F / P, B_fwd / W, B_bwd / W) of one call: ideal compute and memory seconds (forward F;
    P the GPU's peak for the model's dtype, scaled by its compute transfer)."""
    flops = layer.fwd_flops_per_token * model.seq_len * mbs
    fwd, bwd = traffic_bytes(layer, model, mbs)
    return (
        flops / (gpu.matmul_flops_per_s(model.dtype_bytes) * gpu.compute_transfer),
        fwd / gpu.mem_bw_bytes_per_s,
        bwd / gpu.mem_bw_bytes_per_s,
    )


def _lstsq(cols: list[list[float]], b: list[float]) -> list[float]:
    """argmin |A x - b| for A given by its columns (full column rank), by Householder QR in
    Python floats with every sum correctly rounded (`math.fsum`): the same bits on every CPU.
    LAPACK's answer differs in its last bits from one CPU to another (OpenBLAS picks kernels
    per CPU), and near-ties in the search then flip: a 12-GPU cluster of the tests got a plan
    1.4% slower on an AVX-512 machine than on an AVX2 one."""
    cols, b, n = [c[:] for c in cols], b[:], len(cols)
    for k in range(n):
        v = cols[k][k:]
        v[0] += math.copysign(math.sqrt(math.fsum(e * e for e in v)), v[0])
        vv = math.fsum(e * e for e in v)
        for c in [*cols[k:], b]:  # reflect the remaining columns and b: c -= 2 v (v.c) / (v.v)
            f = 2 * math.fsum(e * x for e, x in zip(v, c[k:])) / vv
            c[k:] = [x - f * e for e, x in zip(v, c[k:])]
    x = [0.0] * n
    for k in reversed(range(n)):  # back substitution on R (row k of R: cols[j][k], j >= k)
        x[k] = (b[k] - math.fsum(cols[j][k] * x[j] for j in range(k + 1, n))) / cols[k][k]
    return x


def _fit(x: np.ndarray, y: np.ndarray) -> Coefs:
    """Non-negative least squares on relative error, by dropping negative terms and refitting."""
    active = [k for k in range(3) if x[:, k].any()]
    while True:
        sol = np.array(_lstsq((x[:, active] / y[:, None]).T.tolist(), [1.0] * len(y)))
        if (sol >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(sol)))
    coef = np.zeros(3)
    coef[active] = np.maximum(sol, 0)
    return Coefs(*coef.tolist())


def calibrate(rows: list[Measurement], gpu: GpuType) -> Calibration:
    """Fit the block and embedding coefficients from measurements on `gpu`; derive the head's.

    Head rows are not fitted (see the module docstring): the head takes the blocks' matmul
    coefficient, streams its norm and loss at `STREAM_EFFICIENCY`, and has an embedding's
    launch overhead (a few kernels each way)."""
    fwd, bwd = {}, {}
    for kind in FITTED_KINDS:
        sel = [r for r in rows if r.layer.kind == kind]
        if not sel:
            raise ValueError(f"calibration needs measured {kind} rows")
        feats = np.array([features(r.layer, r.model, r.mbs, gpu) for r in sel])
        ones = np.ones((len(sel), 1))
        fwd[kind] = _fit(np.hstack([feats[:, :2], ones]), np.array([r.fwd_s for r in sel]))
        # Backward does twice the forward's matmul FLOPs.
        xb = np.hstack([2 * feats[:, :1], feats[:, 2:], ones])
        bwd[kind] = _fit(xb, np.array([r.bwd_s for r in sel]))
    stream = 1 / STREAM_EFFICIENCY
    fwd["head"] = Coefs(fwd["block"].compute, stream, fwd["embedding"].overhead_s)
    bwd["head"] = Coefs(bwd["block"].compute, stream, fwd["embedding"].overhead_s)
    return Calibration(fwd, bwd)


def _gpt_layer_model(r: dict[str, str]) -> ModelSpec:
    """The one-block GPT model a row of `h200_gpt_layers.csv` was measured with."""
    h = int(r["hidden"])
    cfg = ModelConfig(
        family="gpt",
        vocab_size=50257,
        hidden_size=h,
        num_layers=1,
        num_heads=int(r["heads"]),
        ffn_hidden_size=4 * h,
        max_seq_len=int(r["seq"]),
        position="rope",
        vocab_multiple=1,  # measured as built then: nn.Embedding / nn.Linear over 50257
    )
    return ModelSpec(config=cfg, seq_len=int(r["seq"]))


def h200_measurements(hidden_sizes: set[int] | None = None) -> list[Measurement]:
    """The shipped H200 GPT measurements (optionally only some hidden sizes)."""
    text = resources.files("hetpp.data").joinpath("h200_gpt_layers.csv").read_text()
    out = []
    for r in csv.DictReader(text.splitlines()):
        if hidden_sizes is not None and int(r["hidden"]) not in hidden_sizes:
            continue
        spec = _gpt_layer_model(r)
        layer = next(x for x in spec.layers if x.kind == CSV_KIND[r["layer"]])
        fwd_s, bwd_s = float(r["fwd_ms"]) / 1e3, float(r["bwd_ms"]) / 1e3
        out.append(Measurement(layer, spec, int(r["mbs"]), fwd_s, bwd_s))
    return out


def unpadded_head_efficiency(m: Measurement, gpu: GpuType) -> float:
    """Matmul efficiency a measured head reached: its GEMM FLOPs (forward + backward) over the
    time left after the estimate's norm and cross-entropy passes, as a fraction of peak."""
    compute, fwd_mem, bwd_mem = features(m.layer, m.model, m.mbs, gpu)
    gemm_s = m.fwd_s + m.bwd_s - (fwd_mem + bwd_mem) / STREAM_EFFICIENCY
    return 3 * compute / gemm_s


@cache
def default_calibration() -> Calibration:
    """Calibration on all shipped H200 GPT rows with micro-batch size >= 2 (mbs 1 of narrow
    layers is launch-bound noise that would distort the fit)."""
    rows = [m for m in h200_measurements() if m.mbs >= 2]
    return calibrate(rows, CATALOG["h200"])


def estimate_layer(
    layer: LayerSpec, model: ModelSpec, mbs: float, gpu: GpuType, cal: Calibration | None = None
) -> tuple[float, float]:
    """(fwd_s, bwd_s) of one call of `layer` (of `model`) on `mbs` samples on `gpu`."""
    cal = cal or default_calibration()
    fc, fm, bm = features(layer, model, mbs, gpu)
    f, b = cal.fwd[layer.kind], cal.bwd[layer.kind]
    fwd = f.compute * fc + f.memory * fm + f.overhead_s
    bwd = b.compute * 2 * fc + b.memory * bm + b.overhead_s
    return fwd, bwd
