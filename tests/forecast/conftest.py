"""Fixtures for the forecaster tests: a made-up GPU, the shared data folder, trained weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from forecast.gpus import GPUSpec
from forecast.kernels import Dtype

SHARED = Path(__file__).resolve().parents[3] / "shared"
NEUSIGHT = SHARED / "data" / "neusight"


@pytest.fixture
def tiny_gpu() -> GPUSpec:
    """A made-up GPU with round numbers: 10 SMs x 64 lanes at 1 GHz, 100 GB/s, 1 MiB L2."""
    return GPUSpec(
        id="tiny",
        name="Tiny GPU",
        vendor="NVIDIA",
        architecture="Test",
        compute_capability="8.0",
        num_sms=10,
        fp32_lanes_per_sm=64,
        fp32_dedicated_lanes_per_sm=64,
        boost_clock_hz=1e9,
        tdp_w=100.0,
        hbm_bytes=1e9,
        hbm_bw_bytes_per_s=1e11,
        l2_bytes=2**20,
        regs_bytes_per_sm=256 * 1024,
        peak_flops_per_s={Dtype.FP32: 1.28e12, Dtype.BF16: 1e13},
    )


@pytest.fixture
def neusight_dir() -> Path:
    """The shared NeuSight data folder, or a skip for a clone without ../shared."""
    if not (NEUSIGHT / "kernels" / "nvidia").is_dir():
        pytest.skip(f"NeuSight data not found at {NEUSIGHT} (clone without ../shared)")
    return NEUSIGHT
