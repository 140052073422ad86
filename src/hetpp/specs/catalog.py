"""GPU types and the built-in catalog of public datasheet figures."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat


class GpuType(BaseModel):
    """One kind of accelerator, as the cost model sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    """Type name, e.g. `A100-80GB`; catalog lookups ignore case."""
    bf16_tflops: float = Field(gt=0, le=100_000)
    """Peak dense bf16/fp16 tensor-core rate with fp32 accumulation, TFLOP/s (no sparsity);
    at most 100,000, which catches a rate given in FLOP/s."""
    memory_gb: float = Field(gt=0, le=10_000)
    """Device memory, GB (10^9 bytes) as the datasheet gives it; at most 10,000, which catches
    a size given in bytes."""
    mem_bw_GBps: float = Field(gt=0, le=1_000_000)
    """Device memory bandwidth, GB/s."""
    emulate_slowdown: PositiveFloat | None = None
    """CPU emulation only: compute of this type takes `factor x` the measured CPU time.

    When unset, emulation uses (fastest peak in the cluster / this peak)."""

    @property
    def peak_flops_per_s(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return self.mem_bw_GBps * 1e9


def _t(name: str, tflops: float, mem_gb: float, bw: float) -> GpuType:
    return GpuType(name=name, bf16_tflops=tflops, memory_gb=mem_gb, mem_bw_GBps=bw)


# Vendor datasheets, dense (non-sparse) bf16 tensor rate with fp32 accumulation. V100 and T4 have no
# bf16: their fp16 tensor rate is listed, which is what mixed-precision training uses on them.
# SXM parts where both exist. Consumer cards: the fp32-accumulate rate (half the fp16-accumulate).
CATALOG: dict[str, GpuType] = {
    t.name.lower(): t
    for t in (
        _t("H200", 989.4, 141, 4800),
        _t("H100-80GB", 989.4, 80, 3350),
        _t("A100-80GB", 312, 80, 2039),
        _t("A100-40GB", 312, 40, 1555),
        _t("L40S", 362.1, 48, 864),
        _t("A6000", 154.8, 48, 768),
        _t("A10", 125, 24, 600),
        _t("L4", 121, 24, 300),
        _t("V100-32GB", 125, 32, 900),
        _t("V100-16GB", 125, 16, 900),
        _t("T4", 65, 16, 320),
        _t("RTX-4090", 165.2, 24, 1008),
        _t("RTX-3090", 71, 24, 936),
    )
}


def catalog_names() -> list[str]:
    """Catalog type names in their canonical spelling."""
    return [t.name for t in CATALOG.values()]
