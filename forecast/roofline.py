"""The roofline baseline: latency = max(FLOPs / peak, bytes / bandwidth).

Spec-sheet peaks at the boost clock, minimum DRAM traffic, no tiles, no launch cost. It is
the baseline every learned model must beat, and the test double of the MLP model.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from forecast.gpus import GPUSpec
from forecast.kernels import KernelSpec


class RooflineModel:
    """Analytic roofline latency; needs no weights."""

    name = "roofline"

    def predict_s(self, kernels: list[KernelSpec], gpu: GPUSpec) -> npt.NDArray[np.float64]:
        """Seconds per kernel, in input order."""
        out = np.empty(len(kernels), dtype=np.float64)
        for i, k in enumerate(kernels):
            compute = k.flops() / gpu.peak_for(k.dtype)
            out[i] = max(compute, k.bytes() / gpu.hbm_bw_bytes_per_s)
        return out
