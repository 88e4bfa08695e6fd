"""Forecasts that physics bounds, and files the kernel commands read or write: a large fp32
layer norm was forecast above the DRAM's peak bandwidth on Hopper and MI300; a truncated or
misnamed compressed CSV was a traceback; `kernels collect --out X.csv.gz` wrote plain text
that `kernels eval` could not read; `tc-calibrate --measured` silently left out a CSV with no
tensor-core row."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from forecast.gpus import load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.predict import load_latency_model
from simulator.cli import main

SOFTMAX_ROWS = "OPName,Latency,Device,B,H\n" + "softmax,0.1,Tesla T4,1024,1024\n" * 400


@pytest.mark.parametrize("gpu_id", ["h100-nvl-94gb", "h100-sxm5-80gb", "mi300x", "mi325x"])
@pytest.mark.parametrize("op", ["layernorm", "softmax"])
def test_large_row_kernels_stay_under_the_dram_peak(gpu_id: str, op: str) -> None:
    gpu = load_gpu(gpu_id)
    family = OpFamily(op)
    kernels = [
        KernelSpec(family, (r, w), Dtype.FP32, op)
        for r, w in ((1 << 18, 1024), (1 << 20, 1024), (1 << 20, 4096), (1 << 22, 1024))
    ]
    seconds = load_latency_model("tile-mlp").predict_s(kernels, gpu)
    for k, s in zip(kernels, seconds, strict=True):
        dram_bytes = k.bytes() - 2 * gpu.l2_bytes  # what L2 cannot hold
        assert dram_bytes / s <= gpu.hbm_bw_bytes_per_s * (1 + 1e-9), k


def _one_error_line(capsys: pytest.CaptureFixture[str], needle: str) -> None:
    out, err = capsys.readouterr()
    assert out == "" and needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name", ["m.csv.gz", "m.csv.zip", "m.csv.bz2"])
def test_a_broken_compressed_csv_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = tmp_path / name
    whole = gzip.compress(SOFTMAX_ROWS.encode())
    path.write_bytes(whole[: len(whole) // 2])  # truncated, or misnamed
    assert main(["kernels", "eval", "--csv", str(path)]) == 2
    _one_error_line(capsys, f"cannot read {path}")


def test_collect_refuses_a_compressed_out_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.csv.gz"
    argv = ["kernels", "collect", "--device", "cpu", "--out", str(out), "--budget-s", "1"]
    assert main(argv) == 2
    _one_error_line(capsys, "give a .csv path")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["", SOFTMAX_ROWS])
def test_tc_calibrate_refuses_a_measured_csv_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "m.csv"
    path.write_text(text)
    assert main(["kernels", "tc-calibrate", "--measured", str(path)]) == 2
    _one_error_line(capsys, "no tensor-core GEMM")
