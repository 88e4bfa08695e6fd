"""TensorCoreModel: errors for unknown pairs, wave quantisation, calibration vs measurements."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from forecast.bandwidth import BandwidthModel
from forecast.dtype_router import DtypeRouter
from forecast.gpus import GPUError, GPUSpec, load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.predict import load_latency_model
from forecast.roofline import RooflineModel
from forecast.tc_calibrate import DEFAULT_DATA_DIR, calibrate, validation_rows
from forecast.tensor_core import TensorCoreError, TensorCoreModel, load_params
from simulator.cli import main

A100, H200 = "a100-sxm4-80gb", "h200-sxm-141gb"
needs_data = pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / "microbenchmarks.json").is_file(), reason="no ../shared data"
)


def _gemm(n: int, dtype: Dtype, m: int | None = None) -> KernelSpec:
    return KernelSpec(OpFamily.BMM, (1, m or n, n, n), dtype)


def test_fp8_on_a100_is_a_clear_error() -> None:
    with pytest.raises(GPUError, match=r"^dtype fp8: .* no fp8 peak .*; use one of bf16"):
        TensorCoreModel().predict_s([_gemm(1024, Dtype.FP8)], load_gpu(A100))


@pytest.mark.parametrize(
    "kernel",
    [_gemm(256, Dtype.FP32), KernelSpec(OpFamily.SOFTMAX, (8, 128), Dtype.BF16)],
)
def test_non_tensor_core_kernels_are_refused(kernel: KernelSpec, tiny_gpu: GPUSpec) -> None:
    with pytest.raises(TensorCoreError):
        TensorCoreModel().predict_s([kernel], tiny_gpu)


def test_never_faster_than_peak_and_batching_is_per_kernel() -> None:
    gpu = load_gpu(H200)
    kernels = [_gemm(n, dt) for n in (128, 1000, 4096, 16384) for dt in (Dtype.BF16, Dtype.FP8)]
    kernels.append(KernelSpec(OpFamily.ATTENTION, (32, 4096, 4096, 128), Dtype.BF16))
    model = TensorCoreModel()
    batched = model.predict_s(kernels, gpu)
    single = np.array([model.predict_s([k], gpu)[0] for k in kernels])
    np.testing.assert_allclose(batched, single)
    peaks = np.array([gpu.peak_for(k.dtype) for k in kernels])
    assert np.all(np.array([k.flops() for k in kernels]) / batched < peaks)


def test_wave_quantisation_one_more_tile_row_costs_a_wave() -> None:
    """1024 x 2145 on A100: 136 tiles of 128x128 on 108 SMs run two waves, not 1.05x."""
    gpu, model = load_gpu(A100), TensorCoreModel()
    base, wider = model.predict_s([_gemm(1024, Dtype.FP16), _gemm(1024, Dtype.FP16, 2145)], gpu)
    assert wider / base > 1.5


def test_attention_flops_and_bytes_closed_form() -> None:
    k = KernelSpec(OpFamily.ATTENTION, (2, 8, 16, 4), Dtype.FP16)
    assert k.flops() == 4 * 2 * 8 * 16 * 4
    assert k.bytes() == 2 * 2 * 4 * (2 * 8 + 2 * 16)


@needs_data
def test_holdout_gpu_within_targets() -> None:
    """Calibrated on A100 FP16 only: H200 FP8 GEMMs within 10% above 2048^3, 25% below."""
    rows = validation_rows(calibrate(holdout=H200))
    held = [r for r in rows if r["split"] == "holdout" and str(r["case"]).startswith("gemm")]
    assert len(held) >= 5
    for r in held:
        m, n, k = (int(x) for x in str(r["case"]).split()[1].split("x"))
        limit = 10.0 if m * n * k > 2048**3 else 25.0
        assert abs(float(r["error_pct"])) <= limit, r  # type: ignore[arg-type]


@needs_data
def test_committed_constants_are_the_calibration_output() -> None:
    fresh, committed = calibrate(holdout=H200), load_params()
    assert committed.calibrated_on == fresh.calibrated_on == A100
    assert committed.level == pytest.approx(fresh.level)
    assert committed.launch_s == pytest.approx(fresh.launch_s)
    assert committed.fa_efficiency == pytest.approx(fresh.fa_efficiency)


def test_router_sends_each_dtype_to_its_model(tiny_gpu: GPUSpec) -> None:
    router = DtypeRouter(RooflineModel, bandwidth=BandwidthModel(0.5, launch_s=1e-6))
    fp32 = _gemm(256, Dtype.FP32)
    soft = KernelSpec(OpFamily.SOFTMAX, (1024, 1024), Dtype.BF16)
    gemm = _gemm(2048, Dtype.BF16)
    got = router.predict_s([fp32, soft, gemm], tiny_gpu)
    assert got[0] == RooflineModel().predict_s([fp32], tiny_gpu)[0]
    assert got[1] == pytest.approx(1e-6 + 2 * 2 * 1024 * 1024 / (0.5 * 1e11))
    assert got[2] == TensorCoreModel().predict_s([gemm], tiny_gpu)[0]
    assert [router.route(k) for k in (fp32, soft, gemm)] == ["fp32", "bandwidth", "tensor-core"]


def test_tf32_is_a_matmul_mode_other_kernels_stay_fp32(tiny_gpu: GPUSpec) -> None:
    router = DtypeRouter(RooflineModel, bandwidth=BandwidthModel(0.5, launch_s=1e-6))
    norm32, norm_tf32 = (KernelSpec(OpFamily.LAYERNORM, (2048, 1280), d) for d in FP32_TF32)
    assert router.route(norm_tf32) == "fp32"
    assert router.predict_s([norm_tf32], tiny_gpu)[0] == router.predict_s([norm32], tiny_gpu)[0]
    assert router.route(_gemm(2048, Dtype.TF32)) == "tensor-core"


FP32_TF32 = (Dtype.FP32, Dtype.TF32)


def test_auto_model_is_registered_and_fp32_unchanged() -> None:
    gpu, k = load_gpu(A100), _gemm(512, Dtype.FP32)
    try:
        mlp = load_latency_model("tile-mlp")
    except ValueError:
        pytest.skip("no trained weights")
    assert load_latency_model("auto").predict_s([k], gpu)[0] == mlp.predict_s([k], gpu)[0]


def test_cli_predict_gemm_fp8_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["kernels", "predict", "--gpu", H200, "--op", "gemm", "--dims", "8192,8192,8192"]
    assert main([*argv, "--dtype", "fp8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tflops"] == pytest.approx(2 * 8192**3 / out["latency_s"] / 1e12)
    assert 0 < out["tflops"] < 1979


@needs_data
def test_an_unknown_holdout_is_refused_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    # 'foo' calibrated on every GPU and reported no held-out row
    assert main(["kernels", "tc-calibrate", "--holdout", "foo"]) == 2
    err = capsys.readouterr().err
    assert "holdout 'foo'" in err and "h200-sxm-141gb" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "cannot read"),  # no file: the error did not name --data
        ("garbage{", "cannot read"),  # JSONDecodeError traceback
        ('{"x": 1}', "expected a JSON list"),  # TypeError traceback
        ("[]", "no gemm_cublaslt or flash_attention_2"),  # "hold out one of , or 'none'"
        ('[{"gpu": "a100-sxm4-80gb", "gemm_cublaslt": [{"m": 1}]}]', "record 0: lacks 'n'"),
        (
            '[{"gpu": "a100-sxm4-80gb", "gemm_cublaslt": '
            '[{"m": 1, "n": 2, "k": 3, "dtype": "fp16", "tflops": 0}]}]',
            "gemm tflops must be a positive number",
        ),
    ],
)
def test_tc_calibrate_names_a_broken_microbenchmarks_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, needle: str
) -> None:
    if content is not None:
        (tmp_path / "microbenchmarks.json").write_text(content)
    assert main(["kernels", "tc-calibrate", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "microbenchmarks.json" in err and needle in err and "--data" in err
    assert err.count("\n") == 1


COLLECTED_HEADER = "OPName,B,M,N,K,H,Latency,Device,dtype,Kernel Name\n"


def _collected(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "h200.csv"
    path.write_text(COLLECTED_HEADER + "".join(f"{ln}\n" for ln in lines))
    return path


def test_collected_csv_gives_tensor_core_gemm_and_fa2_forward_cases(tmp_path: Path) -> None:
    from forecast.tc_calibrate import collected_cases

    path = _collected(
        tmp_path,
        "bmm,1,4096,4096,4096,,0.2,NVIDIA H200,bf16,sm90_xmma_gemm",
        "attention,32,8192,8192,128,,3.0,NVIDIA H200,fp16,flash_fwd_kernel<Flash_traits>",
        "attention,32,8192,8192,128,,3.0,NVIDIA H200,fp16,cudnn_generated_sdpa",  # not FA2
        "bmm,1,4096,4096,4096,,1.9,NVIDIA H200,fp32,sm90_sgemm",  # CUDA cores
        "add,8192,,,,4096,0.05,NVIDIA H200,bf16,elementwise_kernel",  # memory-bound
    )
    gemm, fa = collected_cases([path])
    assert (gemm.gpu_id, gemm.family, gemm.source) == (H200, OpFamily.BMM, str(path))
    assert gemm.measured_tflops == pytest.approx(2 * 4096**3 / 0.2e-3 / 1e12)
    assert fa.family is OpFamily.ATTENTION and fa.kernels[0].op == "attention"
    assert fa.measured_tflops == pytest.approx(4 * 32 * 8192**2 * 128 / 3.0e-3 / 1e12)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("bmm,1,64,64,64,,0.1,x86_64,bf16,aten::bmm", "line 2: unknown device 'x86_64'"),
        ("bmm,1,64,64,64,,0.1,NVIDIA H100 80GB HBM3,bf16,gemm", "line 2: an H100 measurement"),
        ("bmm,1,64,x,64,,0.1,NVIDIA H200,bf16,gemm", "column N must be a positive number"),
        ("bmm,1,64,64,64,,0,NVIDIA H200,bf16,gemm", "column Latency must be a positive"),
    ],
)
def test_tc_calibrate_refuses_a_bad_collected_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, needle: str
) -> None:
    path = _collected(tmp_path, line)
    assert main(["kernels", "tc-calibrate", "--measured", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(path) in err and err.count("\n") == 1


@needs_data
def test_collected_measurements_join_the_calibration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _collected(tmp_path, "bmm,1,8192,8192,8192,,1.5,NVIDIA H200,bf16,sm90_xmma_gemm")
    argv = ["kernels", "tc-calibrate", "--holdout", A100, "--measured", str(path), "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    mine = [r for r in rows if r["source"] == str(path)]
    assert len(mine) == 1 and mine[0]["split"] == "calibration" and mine[0]["gpu"] == H200
    assert {r["split"] for r in rows if r["gpu"] == A100} == {"holdout"}
    published = calibrate(holdout=A100)
    with_mine = calibrate(holdout=A100, measured=[path])
    assert with_mine != published  # the collected row moved the fit
