"""Kernel times inside a model's stream, from forecasts of kernels timed one call at a time.

The kernel data (and so the forecasts) time one PyTorch call with CUDA events. Below a few
megabytes the host's dispatch of that call dominates: on the A100-PCIE-40GB every element-wise
``add`` up to 2^20 elements (12.6 MB of traffic, about 9 us on the wire) measures the same
26-27 us, and the times leave that floor only past about 1.5 x it (2^21 elements: median 39.5
us). Inside a training or inference step the host runs ahead of the GPU, queued kernels start
back to back, and a kernel costs its device time; whether the host keeps up is the whole-model
model's business (`simulator.e2e.Overheads.host_s`), not the kernel's.

So a forecast ``P`` is read as ``max(F, D)``: ``F`` the floor, the forecast of a trivial kernel
of the same op on the same GPU (its device time is nil), ``D`` the device time. At or below
``F`` the device time is hidden, and the roofline time ``R`` (bytes or FLOPs at the spec peaks)
stands for it; from ``1.5 F`` up the forecast is the device time; in between the two blend
linearly: ``D = min(P, max(R, P - w F))``, ``w`` going from 1 at ``P = F`` to 0 at
``P = 1.5 F`` (never above ``P``: where the roofline's peak is not the one the kernel runs on,
as AMD's matrix FP32, ``R`` can exceed it).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from forecast.gpus import GPUSpec
from forecast.kernels import GEMM_FAMILIES, KernelSpec, OpFamily
from forecast.predict import LatencyModel, LatencyTable, forecast_table
from forecast.roofline import RooflineModel

DEVICE_FROM = 1.5  # forecasts above this many floors are device time as they stand


def trivial_kernel(k: KernelSpec) -> KernelSpec:
    """The same op at a size whose device time is nil: what one call of it costs the host."""
    tiny = (
        (1, 16, 16, 16) if k.family in GEMM_FAMILIES or k.family is OpFamily.ATTENTION else (1, 32)
    )
    return KernelSpec(k.family, tiny, k.dtype, k.op)


def stream_table(kernels: Iterable[KernelSpec], gpu: GPUSpec, model: LatencyModel) -> LatencyTable:
    """Device seconds of every distinct kernel when it runs in a stream (module docstring)."""
    called = forecast_table(kernels, gpu, model)
    if not called:
        return {}
    floors = forecast_table({trivial_kernel(k) for k in called}, gpu, model)
    ks = list(called)
    roof = RooflineModel().predict_s(ks, gpu)
    out: LatencyTable = {}
    for k, r in zip(ks, roof, strict=True):
        p, f = called[k], floors[trivial_kernel(k)]
        w = float(np.clip((DEVICE_FROM * f - p) / ((DEVICE_FROM - 1.0) * f), 0.0, 1.0))
        out[k] = min(p, max(float(r), p - w * f))
    return out
