"""Kernel times in a stream: a forecast read as max(host floor, device time)."""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt
import pytest

from forecast.gpus import GPUSpec
from forecast.kernels import KernelSpec, OpFamily
from forecast.roofline import RooflineModel
from forecast.stream import DEVICE_FROM, stream_table

FLOOR_S = 20e-6


class FlooredRoofline:
    """Times one call the way the kernel data do: the roofline, but never under a host floor."""

    name = "floored"

    def predict_s(self, kernels: list[KernelSpec], gpu: GPUSpec) -> npt.NDArray[np.float64]:
        return np.maximum(RooflineModel().predict_s(kernels, gpu), FLOOR_S)


def _add(elements: int) -> KernelSpec:
    return KernelSpec(OpFamily.ELEMENTWISE, (1, elements), op="add")


def test_floor_bound_kernels_cost_their_device_time(tiny_gpu: GPUSpec) -> None:
    small = _add(1000)  # 12 kB: far under the floor
    roof = float(RooflineModel().predict_s([small], tiny_gpu)[0])
    assert roof < FLOOR_S / 10
    assert stream_table([small], tiny_gpu, FlooredRoofline())[small] == pytest.approx(roof)


def test_kernels_well_above_the_floor_keep_their_forecast(tiny_gpu: GPUSpec) -> None:
    big = _add(10_000_000)  # 120 MB at 100 GB/s: 1.2 ms
    called = float(FlooredRoofline().predict_s([big], tiny_gpu)[0])
    assert called > DEVICE_FROM * FLOOR_S
    assert stream_table([big], tiny_gpu, FlooredRoofline())[big] == called


def test_stream_times_rise_with_size_and_never_exceed_the_call(tiny_gpu: GPUSpec) -> None:
    kernels = [_add(n) for n in np.geomspace(100, 1e7, 60).astype(int)]
    table = stream_table(kernels, tiny_gpu, FlooredRoofline())
    called = FlooredRoofline().predict_s(kernels, tiny_gpu)
    times = [table[k] for k in kernels]
    assert all(b >= a for a, b in itertools.pairwise(times))
    assert all(t <= c for t, c in zip(times, called, strict=True))
