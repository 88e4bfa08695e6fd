"""What a GPU description must hold beyond positive, finite numbers of the right type: each
number under a bound no GPU comes near, an FP32 peak, and an FP32 peak that its SMs, lanes
and clock deliver.

The tile-MLP prices FP32 kernels from ``num_sms x fp32_lanes_per_sm x boost_clock_hz`` while
the tensor-core model and the printed rates read ``peak_flops_per_s``: a file with more SMs
and the old peak (a what-if edited in one place) was forecast an FP32 GEMM at 265% of its
stated peak and a bf16 GEMM 2e11 times slower than the real GPU. Every catalog GPU and
NeuSight device sheet agrees within 4%.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forecast.kernels import Dtype

if TYPE_CHECKING:  # gpu_sheet.py and gpus.py import this module
    from forecast.gpu_spec import GPUSpec

# upper bounds, about 300x or more the largest GPU of the catalog (MI300X: 304 CUs, 5.3 TB/s)
LIMITS: dict[str, float] = {
    "num_sms": 100_000,
    "fp32_lanes_per_sm": 1024,
    "fp32_dedicated_lanes_per_sm": 1024,
    "boost_clock_hz": 1e10,
    "base_clock_hz": 1e10,
    "process_nm": 1000,
    "tdp_w": 1e5,
    "hbm_bytes": 1e15,
    "hbm_bw_bytes_per_s": 1e15,
    "l2_bytes": 1e12,
    "smem_bytes_per_sm": 1e9,
    "regs_bytes_per_sm": 1e9,
    "fp32_matrix_flops_per_s": 1e18,
}
PEAK_LIMIT_FLOPS_PER_S = 1e18
# lower bounds, 100x or more under the least of the catalog (P4: 192 GB/s of DRAM, 8 GB, a
# 2 MB L2; clocks over 1 GHz): 1e-3 B/s of DRAM forecast a linear layer at 3.6e9 s
FLOORS: dict[str, float] = {
    "hbm_bw_bytes_per_s": 1e9,
    "boost_clock_hz": 1e7,
    "hbm_bytes": 1e8,
    "l2_bytes": 1e4,
}
# `memory_type` picks the row kernels' reachable share of DRAM bandwidth (HBM or not): a
# typo ("XYZ") was read as GDDR without a word
MEMORY_TYPES = ("HBM", "GDDR", "LPDDR", "DDR")
FP32_AGREEMENT = 0.10  # the FP32 peak within 10% of 2 x SMs x lanes x boost clock


def _too_large(gpu: GPUSpec) -> str | None:
    """The first field over its bound or under its floor, or a `memory_type` that names no DRAM,
    as an error message naming it, or None."""
    values = {name: getattr(gpu, name) for name in LIMITS}
    values |= {f"peak_flops_per_s.{d.value}": v for d, v in gpu.peak_flops_per_s.items()}
    for name, value in values.items():
        limit = LIMITS.get(name, PEAK_LIMIT_FLOPS_PER_S)
        if value is not None and value > limit:
            return f"field {name!r} must be at most {limit:g}, got {value:g}; give the GPU's value"
    for name, floor in FLOORS.items():
        if getattr(gpu, name) < floor:
            return (
                f"field {name!r} must be at least {floor:g}, got {getattr(gpu, name):g}; give "
                "the GPU's value in SI units"
            )
    kind = gpu.memory_type.upper()
    if kind != "UNKNOWN" and not kind.startswith(MEMORY_TYPES):
        return (
            f"field 'memory_type' is {gpu.memory_type!r}; give the DRAM technology (HBM2e, "
            "HBM3, GDDR6, LPDDR5X, ...) or 'unknown'"
        )
    return None


def _inconsistent(gpu: GPUSpec) -> str | None:
    """Two fields that no GPU holds together, as an error message naming them, or None: more
    dedicated FP32 lanes than lanes (a 4096^3 FP32 GEMM forecast at 183% of the file's FP32
    peak), or a tensor-core peak under the FP32 one (every catalog GPU's is 2-63x it; a bf16
    peak written in TFLOP/s, 989.5, forecast that GEMM at 174 million seconds)."""
    if gpu.fp32_dedicated_lanes_per_sm > gpu.fp32_lanes_per_sm:
        return (
            f"field 'fp32_dedicated_lanes_per_sm' ({gpu.fp32_dedicated_lanes_per_sm}) must be "
            f"at most fp32_lanes_per_sm ({gpu.fp32_lanes_per_sm}); give the lanes not shared "
            "with INT32 (all of them on most GPUs)"
        )
    fp32 = gpu.peak_flops_per_s.get(Dtype.FP32)
    for dtype, peak in gpu.peak_flops_per_s.items():
        if fp32 is not None and dtype is not Dtype.FP32 and peak < fp32:
            return (
                f"field 'peak_flops_per_s.{dtype.value}' is {peak:.4g} FLOP/s, under the FP32 "
                f"peak ({fp32:.4g}); give the dense tensor-core peak in FLOP/s (not TFLOP/s), "
                "or leave the dtype out"
            )
    return None


def plausibility_error(gpu: GPUSpec, *, fp32_agreement: bool = True) -> str | None:
    """Why a validated `forecast.gpus.GPUSpec` cannot be a GPU (one line naming the field and
    the fix), or None. ``fp32_agreement``: check the FP32 peak against SMs x lanes x clock
    (a NeuSight sheet's lanes are derived from its peak, so it agrees by construction)."""
    why = _too_large(gpu) or _inconsistent(gpu)
    if why or not fp32_agreement:
        return why
    peaks = gpu.peak_flops_per_s
    lanes_rate = 2.0 * gpu.num_sms * gpu.fp32_lanes_per_sm * gpu.boost_clock_hz
    implied = f"2 x num_sms x fp32_lanes_per_sm x boost_clock_hz = {lanes_rate:.4g}"
    if Dtype.FP32 not in peaks:
        return f"field 'peak_flops_per_s.fp32' is missing; give the FP32 peak ({implied})"
    fp32 = peaks[Dtype.FP32]
    if abs(fp32 / lanes_rate - 1.0) > FP32_AGREEMENT:
        return (
            f"field 'peak_flops_per_s.fp32' is {fp32:.4g} FLOP/s but {implied}; "
            f"make them agree within {FP32_AGREEMENT:.0%} (a GPU with more SMs or a higher "
            "clock has its peaks scaled too)"
        )
    return None
