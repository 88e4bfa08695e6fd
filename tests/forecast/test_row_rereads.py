"""Softmax and layer-norm memory time counts their row re-reads: from DRAM when the rows in
flight overflow L2, free when they fit, and no L2 rate caps fast DRAM (closed forms on the
made-up `tiny_gpu`: 10 SMs at 1 GHz, 100 GB/s, 1 MiB L2, 2,048 threads an SM)."""

from __future__ import annotations

import pytest

from forecast.features import build_features
from forecast.gpus import GPUSpec
from forecast.kernels import Dtype, KernelSpec, OpFamily


def _memory_s(gpu: GPUSpec, family: OpFamily, rows: int, width: int) -> tuple[float, float]:
    """(memory seconds, bytes of one pass over the input) of one fp32 kernel."""
    op = family.value
    k = KernelSpec(family, (rows, width), Dtype.FP32, op)
    return float(build_features(gpu, [k]).memory_s[0]), 4.0 * rows * width


def _bytes(family: OpFamily, rows: int, width: int) -> float:
    return KernelSpec(family, (rows, width), Dtype.FP32).bytes()


def test_layer_norm_rows_overflowing_l2_read_twice_from_dram(tiny_gpu: GPUSpec) -> None:
    # 16 resident 128-thread blocks x 10 SMs x 16 KB rows = 2.6 MB in flight > 1 MiB L2
    got, one_pass = _memory_s(tiny_gpu, OpFamily.LAYERNORM, 10_000, 4096)
    want = (_bytes(OpFamily.LAYERNORM, 10_000, 4096) + one_pass) / 1e11
    assert got == pytest.approx(want, rel=1e-12)


def test_rows_that_fit_l2_cost_one_read(tiny_gpu: GPUSpec) -> None:
    big_l2 = tiny_gpu.model_copy(update={"l2_bytes": 2.0**30, "hbm_bw_bytes_per_s": 5e10})
    got, _ = _memory_s(big_l2, OpFamily.LAYERNORM, 10_000, 4096)
    assert got == pytest.approx(_bytes(OpFamily.LAYERNORM, 10_000, 4096) / 5e10, rel=1e-12)
    got, _ = _memory_s(big_l2, OpFamily.SOFTMAX, 10_000, 16384)
    assert got == pytest.approx(_bytes(OpFamily.SOFTMAX, 10_000, 16384) / 5e10, rel=1e-12)


def test_wide_softmax_overflowing_l2_takes_twice_the_one_read_time(tiny_gpu: GPUSpec) -> None:
    # 2 resident 1,024-thread blocks x 10 SMs x 64 KB rows = 1.3 MB in flight > 1 MiB L2:
    # three reads and a write where the minimum counts one of each
    got, _ = _memory_s(tiny_gpu, OpFamily.SOFTMAX, 10_000, 16384)
    assert got == pytest.approx(2 * _bytes(OpFamily.SOFTMAX, 10_000, 16384) / 1e11, rel=1e-12)


def test_narrow_softmax_reads_once(tiny_gpu: GPUSpec) -> None:
    small_l2 = tiny_gpu.model_copy(update={"l2_bytes": 2.0**10})  # every re-read would miss
    got, _ = _memory_s(small_l2, OpFamily.SOFTMAX, 100_000, 1024)
    assert got == pytest.approx(_bytes(OpFamily.SOFTMAX, 100_000, 1024) / 1e11, rel=1e-12)


def test_fast_dram_with_rows_in_l2_runs_at_dram_peak(tiny_gpu: GPUSpec) -> None:
    # 1 TB/s DRAM on 10 SMs at 1 GHz: 100 B a clock. The catalog has no measured L2 bandwidth,
    # so no L2 rate holds it back (a fitted 16 B a clock per SM made layer norm 9x slower)
    fast = tiny_gpu.model_copy(update={"hbm_bw_bytes_per_s": 1e12, "l2_bytes": 2.0**30})
    for family, width in ((OpFamily.LAYERNORM, 4096), (OpFamily.SOFTMAX, 16384)):
        got, _ = _memory_s(fast, family, 10_000, width)
        assert got == pytest.approx(_bytes(family, 10_000, width) / 1e12, rel=1e-12)
