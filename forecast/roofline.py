"""The roofline baseline: latency = max(FLOPs / peak, bytes / bandwidth).

Spec-sheet peaks at the boost clock, minimum DRAM traffic, no tiles, no launch cost. It is
the baseline every learned model must beat, and the test double of the MLP model. An FP32 GEMM
on an AMD GPU is read against the matrix-core (MFMA) FP32 peak that rocBLAS runs it on, as the
tile model reads it (`features.gemm_rate_flops_per_s`), not the vector peak.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from forecast.gpus import GPUSpec
from forecast.kernels import GEMM_FAMILIES, Dtype, KernelSpec


def kernel_peak(gpu: GPUSpec, kernel: KernelSpec) -> tuple[float, str]:
    """The catalog peak a kernel runs at, and its name: the matrix FP32 peak for an FP32 GEMM
    where the GPU has one (AMD's MFMA), else the dtype's peak."""
    matrix = gpu.fp32_matrix_flops_per_s
    if matrix is not None and kernel.family in GEMM_FAMILIES and kernel.dtype is Dtype.FP32:
        return matrix, "matrix fp32 peak"
    return gpu.peak_for(kernel.dtype), f"{kernel.dtype.value} peak"


class RooflineModel:
    """Analytic roofline latency; needs no weights."""

    name = "roofline"

    def predict_s(self, kernels: list[KernelSpec], gpu: GPUSpec) -> npt.NDArray[np.float64]:
        """Seconds per kernel, in input order."""
        out = np.empty(len(kernels), dtype=np.float64)
        for i, k in enumerate(kernels):
            compute = k.flops() / kernel_peak(gpu, k)[0]
            out[i] = max(compute, k.bytes() / gpu.hbm_bw_bytes_per_s)
        return out
