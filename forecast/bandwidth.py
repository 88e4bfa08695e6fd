"""BandwidthModel: memory-bound kernels as ``launch_s + bytes / (efficiency x HBM bandwidth)``.

One model for every memory-bound kernel: tile-mlp's memory family (efficiency and launch
fitted on the training GPUs' fp32 element-wise kernels, `forecast.train.fit_memory_model`)
and the ``auto`` router's non-fp32 element-wise, softmax, layer-norm and memory kernels (the
calibrated STREAM fraction). ``bytes`` is `KernelSpec.bytes`, scaled by the dtype's itemsize.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from forecast.gpus import GPUSpec
from forecast.kernels import KernelSpec

# Memory-bound operators whose kernel streams slower than the rest, as a multiple of the
# bandwidth time: PyTorch's CUDA dropout backward (a masked scale) runs at about a third of
# the bandwidth of other streaming kernels. Fitted by `simulator.e2e_validate.slow_memory_ops`
# on the training traces of the kernel-training GPUs (the V100's; the kernel tables hold no
# dropout); the unseen A100 80GB's and the AMD GPUs' traces show the same (0.22-0.28 of peak
# against 0.75 for a copy). Measured in fp32; applied to every dtype (the same kernel).
SLOW_MEMORY_OPS: dict[str, float] = {"dropout_backward": 2.27}


@dataclass
class BandwidthModel:
    """Launch time plus bytes over an achieved fraction of peak HBM bandwidth (times
    `SLOW_MEMORY_OPS` for the operators that stream slower)."""

    efficiency: float = 0.8
    launch_s: float = 5e-6
    name: str = "bandwidth"

    def predict_s(self, kernels: list[KernelSpec], gpu: GPUSpec) -> npt.NDArray[np.float64]:
        """Seconds per kernel, in input order."""
        nbytes = np.array([k.bytes() for k in kernels], dtype=np.float64)
        slow = np.array([SLOW_MEMORY_OPS.get(k.op, 1.0) for k in kernels], dtype=np.float64)
        return np.asarray(
            self.launch_s + slow * nbytes / (self.efficiency * gpu.hbm_bw_bytes_per_s), np.float64
        )
