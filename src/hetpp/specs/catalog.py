"""GPU types and the built-in catalog of public datasheet figures."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat


class GpuType(BaseModel):
    """One kind of accelerator, as the cost model sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    """Type name, e.g. `A100-80GB`; catalog lookups ignore case."""
    bf16_tflops: float = Field(gt=0, le=100_000)
    """Peak dense bf16/fp16 tensor-core rate with fp32 accumulation, TFLOP/s (no sparsity);
    at most 100,000, which catches a rate given in FLOP/s."""
    fp32_tflops: float | None = Field(None, gt=0, le=100_000)
    """Peak dense FP32 rate without tensor cores, TF32 off, TFLOP/s: what fp32 plans are
    priced at (PyTorch keeps float32 matmuls in full FP32 by default, and hetpp's runtime does
    not enable TF32). Unset: the bf16 rate, the only one a type defined without it has."""
    memory_gb: float = Field(gt=0, le=10_000)
    """Device memory, GB (10^9 bytes) as the datasheet gives it; at most 10,000, which catches
    a size given in bytes."""
    mem_bw_GBps: float = Field(gt=0, le=1_000_000)
    """Device memory bandwidth, GB/s."""
    compute_transfer: PositiveFloat = 1.0
    """Sustained matmul rate of this type relative to what the estimator's H200 calibration
    predicts from its peak (1.0: the calibration transfers unchanged). Catalog values below 1
    rest on published training throughput (`bench/published.py`, notes on CATALOG)."""
    emulate_slowdown: PositiveFloat | None = None
    """CPU emulation only: compute of this type takes `factor x` the measured CPU time.

    When unset, emulation uses (fastest peak in the cluster / this peak)."""

    @property
    def peak_flops_per_s(self) -> float:
        return self.bf16_tflops * 1e12

    def matmul_flops_per_s(self, dtype_bytes: int) -> float:
        """Peak matmul rate for elements of `dtype_bytes`: bf16/fp16 tensor rate for 2-byte
        types, `fp32_tflops` for wider ones."""
        if dtype_bytes <= 2 or self.fp32_tflops is None:
            return self.peak_flops_per_s
        return self.fp32_tflops * 1e12

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return self.mem_bw_GBps * 1e9


def _t(
    name: str, tflops: float, fp32: float, mem_gb: float, bw: float, transfer: float = 1.0
) -> GpuType:
    return GpuType(
        name=name,
        bf16_tflops=tflops,
        fp32_tflops=fp32,
        memory_gb=mem_gb,
        mem_bw_GBps=bw,
        compute_transfer=transfer,
    )


H100_TRANSFER = 0.8
"""llm-foundry's MPT runs on 8 H100-80GB (760m, 1b, 7b, 13b; seq 2048, bf16, FSDP) measured
0.69-0.92x what the H200 calibration predicts at the H100's datasheet peak; 0.8 is their
geometric-mean fit (`bench/published.py`). torchtitan's 33-39% MFU on H100 (Llama 3.1 8B)
points the same way. The A100 needs no factor: the same tables' A100 runs are within 8%."""

V100_TRANSFER = 0.8
"""Two published V100 measurements, both optimistic at 1.0 (`bench/published.py`): Megatron-LM
v1.0's 1.2B GPT on one DGX-2H V100 (nv-adlr.github.io/MegatronLMV1, 1288 ms per batch of 8,
seq 1024) ran at 0.91x the prediction; Languini Kitchen's GPT small/medium/large (seq 512,
fp16, one GPU, github.com/languini-kitchen/languini-kitchen) reached 0.66-0.79x on a V100 of
what the same harness reached on an A100 relative to hetpp's predictions for each. 0.8 fits the
two sources about equally (their log-mean fit is 0.78): Megatron -8%, Languini 0.80-0.93x."""

# Vendor datasheets, dense (non-sparse) bf16 tensor rate with fp32 accumulation. V100 and T4 have no
# bf16: their fp16 tensor rate is listed, which is what mixed-precision training uses on them.
# SXM parts where both exist. Consumer cards: the fp32-accumulate rate (half the fp16-accumulate).
# FP32: the same datasheets' non-tensor FP32 rate.
# What each type's compute transfer rests on (docs/benchmarks-cost.md has the table): H200, the
# calibration itself; A100-80GB, published training throughput (llm-foundry MPT, 6 runs within 8%,
# `bench/published.py`); H100-80GB, H100_TRANSFER; A100-40GB, the same chip as the 80 GB part;
# V100-32GB and V100-16GB (one chip), V100_TRANSFER. RTX-3090: Languini Kitchen's runs were
# checked and left it at 1.0 (mixed: 1.09-1.55x the A100-relative prediction, in a harness whose
# unfused attention favours its bandwidth). T4, RTX-4090, L40S, A6000, A10 and L4 rest on their
# datasheets alone: no published run with settings hetpp can reproduce was found for them.
CATALOG: dict[str, GpuType] = {
    t.name.lower(): t
    for t in (
        _t("H200", 989.4, 66.9, 141, 4800),
        _t("H100-80GB", 989.4, 66.9, 80, 3350, H100_TRANSFER),
        _t("A100-80GB", 312, 19.5, 80, 2039),
        _t("A100-40GB", 312, 19.5, 40, 1555),
        _t("L40S", 362.1, 91.6, 48, 864),
        _t("A6000", 154.8, 38.7, 48, 768),
        _t("A10", 125, 31.2, 24, 600),
        _t("L4", 121, 30.3, 24, 300),
        _t("V100-32GB", 125, 15.7, 32, 900, V100_TRANSFER),
        _t("V100-16GB", 125, 15.7, 16, 900, V100_TRANSFER),
        _t("T4", 65, 8.1, 16, 320),
        _t("RTX-4090", 165.2, 82.6, 24, 1008),
        _t("RTX-3090", 71, 35.6, 24, 936),
    )
}


def catalog_names() -> list[str]:
    """Catalog type names in their canonical spelling."""
    return [t.name for t in CATALOG.values()]


# CUDA device names (`torch.cuda.get_device_name()`) of the parts each entry describes, after
# upper-casing and turning '-' and '_' into spaces. Order matters: the first match wins.
DEVICE_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bH200\b(?!.*\bNVL\b)", "H200"),
    (r"\bH100\b(?!.*\b(PCIE|NVL)\b)", "H100-80GB"),
    (r"\bA100\b.*\b80GB\b", "A100-80GB"),
    (r"\bA100\b", "A100-40GB"),
    (r"\bL40S\b", "L40S"),
    (r"\bRTX A6000\b", "A6000"),
    (r"\bA10\b", "A10"),
    (r"\bL4\b", "L4"),
    (r"\bV100\b.*\b32GB\b", "V100-32GB"),
    (r"\bV100\b", "V100-16GB"),
    (r"\bT4\b", "T4"),
    (r"\bRTX 4090\b", "RTX-4090"),
    (r"\bRTX 3090\b", "RTX-3090"),
)


def catalog_name_for_device(device_name: str) -> str | None:
    """The catalog type a CUDA device name stands for ("NVIDIA A100-SXM4-80GB" -> "A100-80GB"),
    or None when no entry describes that part (H100 PCIe and NVL, A10G, V100S, L40: other
    memory, clocks or bandwidth than their look-alikes)."""
    text = re.sub(r"[-_]", " ", device_name.upper())
    return next((name for pattern, name in DEVICE_NAMES if re.search(pattern, text)), None)
