"""Which latency model prices a dtype.

``auto`` is forecast's dtype router (tile-mlp for fp32, the tensor-core model for bf16/fp16/
tf32/fp8). ``roofline-derated`` is a fallback and a fast test double: the roofline scaled by
sustained-efficiency factors (large cuBLAS GEMMs reach about 80% of the dense tensor-core peak,
streaming kernels about 85% of HBM bandwidth on A100/H100), not a forecast of unseen GPUs.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from forecast.gpus import GPUSpec
from forecast.kernels import GEMM_FAMILIES, KernelSpec
from forecast.predict import LatencyModel, load_latency_model

GEMM_EFFICIENCY = 0.80
MEMORY_EFFICIENCY = 0.85


class DeratedRoofline:
    """Roofline with sustained (not peak) tensor-core and HBM rates."""

    name = "roofline-derated"

    def predict_s(self, kernels: list[KernelSpec], gpu: GPUSpec) -> npt.NDArray[np.float64]:
        """Seconds per kernel, in input order."""
        out = np.empty(len(kernels), dtype=np.float64)
        bw = gpu.hbm_bw_bytes_per_s * MEMORY_EFFICIENCY
        for i, k in enumerate(kernels):
            eff = GEMM_EFFICIENCY if k.family in GEMM_FAMILIES else 1.0
            out[i] = max(k.flops() / (gpu.peak_for(k.dtype) * eff), k.bytes() / bw)
        return out


def latency_model_for(requested: str = "auto") -> LatencyModel:
    """A latency model by name: forecast's models plus ``roofline-derated``."""
    if requested == "roofline-derated":
        return DeratedRoofline()
    return load_latency_model(requested)
