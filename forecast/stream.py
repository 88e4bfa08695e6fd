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

A kernel is never charged more than its twin (the same op and dims, read the same way) in
a dtype with no higher catalog peak and no fewer bytes per element: fp8 <= bf16, fp16 <=
tf32 <= fp32 where the GPU has those peaks (MI100's bf16, at half its fp16 rate, is not
bounded by fp16). It does the same FLOPs at least as fast on no more bytes. The bound matters
where the wider twin sits at its floor and so costs its roofline, while the tensor-core and
bandwidth models' own floors (their launch times, 3-6 us, against the FP32 data's 30-100 us)
leave the narrower kernel just above theirs, and the blend above triples what it has over
that floor. On the A100-SXM4-80GB the GEMM linear 1,256,256,256 was 2.36 us in bf16 against
1.72 us in fp32, and an ``add`` of 2^18 elements 2.78 us in bf16 against 1.54 us in fp32.
Flash attention has no FP32 twin and is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from forecast.gpus import GPUSpec
from forecast.kernels import GEMM_FAMILIES, ITEMSIZE_BYTES, Dtype, KernelSpec, OpFamily
from forecast.predict import LatencyModel, LatencyTable, forecast_table
from forecast.roofline import RooflineModel

DEVICE_FROM = 1.5  # forecasts above this many floors are device time as they stand
WIDER = (Dtype.FP32, Dtype.TF32, Dtype.BF16, Dtype.FP16)  # dtypes whose twins bound a kernel


def trivial_kernel(k: KernelSpec) -> KernelSpec:
    """The same op at a size whose device time is nil: what one call of it costs the host."""
    tiny = (
        (1, 16, 16, 16) if k.family in GEMM_FAMILIES or k.family is OpFamily.ATTENTION else (1, 32)
    )
    return KernelSpec(k.family, tiny, k.dtype, k.op)


def stream_table(kernels: Iterable[KernelSpec], gpu: GPUSpec, model: LatencyModel) -> LatencyTable:
    """Device seconds of every distinct kernel when it runs in a stream (module docstring)."""
    twins = {k: [replace(k, dtype=d) for d in WIDER if _bounded_by(k, d, gpu)] for k in kernels}
    every = {*twins, *(t for ts in twins.values() for t in ts)}  # one batched forecast
    device = _device_table(forecast_table(every, gpu, model), gpu, model)
    return {k: min([device[k], *(device[t] for t in twins[k])]) for k in device if k in twins}


def _device_table(called: LatencyTable, gpu: GPUSpec, model: LatencyModel) -> LatencyTable:
    """Forecasts of one call read as device times: ``min(P, max(R, P - w F))``."""
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


def _bounded_by(k: KernelSpec, wide: Dtype, gpu: GPUSpec) -> bool:
    """Whether ``k``'s twin in dtype ``wide`` bounds it: ``k`` has a peak at least the twin's
    on no more bytes per element (flash attention has no FP32 twin and is left alone)."""
    peaks = gpu.peak_flops_per_s
    if k.family is OpFamily.ATTENTION or k.dtype is wide or k.dtype not in peaks:
        return False
    narrower = ITEMSIZE_BYTES[k.dtype] <= ITEMSIZE_BYTES[wide]
    return wide in peaks and peaks[k.dtype] >= peaks[wide] and narrower
