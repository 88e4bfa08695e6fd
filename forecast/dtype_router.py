"""DtypeRouter: one `LatencyModel` that sends each kernel to the model that knows its dtype.

* fp32 kernels (CUDA cores; every NeuSight measurement) -> the given fp32 model
  (tile-mlp or roofline), unchanged; so are tf32's element-wise, softmax, layer-norm and
  memory kernels (TF32 is a matmul mode: those stay fp32 kernels);
* bmm/linear/attention in tf32, fp16, bf16, fp8 -> `TensorCoreModel`;
* element-wise, softmax, layer norm and memory kernels in fp16, bf16, fp8 -> a bandwidth
  model: launch time plus ``KernelSpec.bytes()`` (which scales with the dtype's itemsize)
  over the achieved fraction of HBM bandwidth (the calibrated STREAM fraction).

Registered in `forecast.predict.LATENCY_MODELS` as ``auto`` (fp32 via tile-mlp).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from forecast.bandwidth import BandwidthModel
from forecast.gpus import GPUSpec
from forecast.kernels import GEMM_FAMILIES, Dtype, KernelSpec, OpFamily
from forecast.predict import LatencyModel
from forecast.tensor_core import TensorCoreModel, load_params

TENSOR_FAMILIES = frozenset({*GEMM_FAMILIES, OpFamily.ATTENTION})


class DtypeRouter:
    """fp32 -> the fp32 model; tensor-core dtypes -> tensor-core or bandwidth model."""

    name = "auto"

    def __init__(
        self,
        fp32_loader: Callable[[], LatencyModel],
        *,
        tensor_core: TensorCoreModel | None = None,
        bandwidth: BandwidthModel | None = None,
    ) -> None:
        self._fp32_loader = fp32_loader
        self._fp32: LatencyModel | None = None
        self.tensor_core = tensor_core or TensorCoreModel()
        self.bandwidth = bandwidth or BandwidthModel(load_params().hbm_efficiency, launch_s=3e-6)

    def route(self, kernel: KernelSpec) -> str:
        """Which model serves a kernel: ``fp32``, ``tensor-core`` or ``bandwidth``. TF32 is
        a matmul mode: its other kernels are fp32 kernels."""
        if kernel.family in TENSOR_FAMILIES:
            fp32 = kernel.dtype is Dtype.FP32 and kernel.family is not OpFamily.ATTENTION
            return "fp32" if fp32 else "tensor-core"
        return "fp32" if kernel.dtype in (Dtype.FP32, Dtype.TF32) else "bandwidth"

    def model_for(self, route: str) -> LatencyModel:
        """The model of a route; the fp32 model is loaded on first use."""
        if route == "tensor-core":
            return self.tensor_core
        if route == "bandwidth":
            return self.bandwidth
        if self._fp32 is None:
            self._fp32 = self._fp32_loader()
        return self._fp32

    def predict_s(self, kernels: list[KernelSpec], gpu: GPUSpec) -> npt.NDArray[np.float64]:
        """Seconds per kernel, in input order; one batched call per routed model. A dtype the
        GPU has no catalog peak for is a `GPUError` on the bandwidth route too, as it is on
        the tensor-core one (an fp8 ``add`` on an A100 was forecast as if it had fp8)."""
        out = np.empty(len(kernels), dtype=np.float64)
        routes = [self.route(k) for k in kernels]
        narrow = {k.dtype for k, r in zip(kernels, routes, strict=True) if r == "bandwidth"}
        for dtype in sorted(narrow):
            gpu.peak_for(dtype)
        for route in ("fp32", "tensor-core", "bandwidth"):
            idx = [i for i, r in enumerate(routes) if r == route]
            if idx:
                batch = [kernels[i] for i in idx]
                if route == "fp32":
                    batch = [replace(k, dtype=Dtype.FP32) for k in batch]
                out[idx] = self.model_for(route).predict_s(batch, gpu)
        return out
