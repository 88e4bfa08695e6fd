"""Tensor-core GEMM and flash-attention forecasts against physics, across the GPU catalog.

Closed forms (FLOPs, the dense-peak ceiling) and metamorphic relations (more work is never
faster; more bandwidth, more SMs with their FLOPs, or a higher peak is never slower; narrower
dtypes are never slower on large GEMMs), and the ``kernels predict`` CLI's answers and errors.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from forecast.flash_attention import has_flash_attention
from forecast.gpus import GPUSpec, list_gpus, load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.tensor_core import TensorCoreError, TensorCoreModel
from simulator.cli import main

GPU_IDS = [g if isinstance(g, str) else g.id for g in list_gpus()]
TC_DTYPES = (Dtype.TF32, Dtype.FP16, Dtype.BF16, Dtype.FP8)
MODEL = TensorCoreModel()
RNG = np.random.default_rng(8)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["kernels", "predict", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _gemms(dtype: Dtype, n: int = 120) -> list[KernelSpec]:
    dims = RNG.integers(1, 9000, size=(n, 4))
    dims[:, 0] = RNG.integers(1, 16, size=n)
    out = [KernelSpec(OpFamily.BMM, tuple(int(x) for x in d), dtype) for d in dims[: n // 2]]
    out += [
        KernelSpec(OpFamily.LINEAR, (1, *(int(x) for x in d[1:])), dtype) for d in dims[n // 2 :]
    ]
    return out


def _attention(dtype: Dtype, n: int = 40) -> list[KernelSpec]:
    out = []
    for op in ("attention", "attention_bwd"):
        for _ in range(n // 2):
            bh, sq, skv = (int(x) for x in RNG.integers(1, 8192, size=3))
            d = int(RNG.choice([32, 48, 64, 80, 96, 128, 160, 192, 256]))
            out.append(KernelSpec(OpFamily.ATTENTION, (bh % 64 + 1, sq, skv, d), dtype, op))
    return out


def _supported(gpu: GPUSpec) -> list[Dtype]:
    return [d for d in TC_DTYPES if d in gpu.peak_flops_per_s]


@pytest.mark.parametrize("gpu_id", GPU_IDS)
def test_achieved_flops_never_exceed_the_dense_peak(gpu_id: str) -> None:
    gpu = load_gpu(gpu_id)
    for dtype in _supported(gpu):
        kernels = [*_gemms(dtype), KernelSpec(OpFamily.BMM, (64, 8192, 8192, 8192), dtype)]
        if dtype in (Dtype.FP16, Dtype.BF16) and has_flash_attention(gpu):
            kernels += _attention(dtype)
        flops = np.array([k.flops() for k in kernels])
        assert np.all(flops / MODEL.predict_s(kernels, gpu) <= gpu.peak_for(dtype))


@pytest.mark.parametrize("gpu_id", GPU_IDS)
def test_a_larger_gemm_is_never_faster(gpu_id: str) -> None:
    """No step down at all: the tile/split choice is a minimum over monotone times, and wave
    quantisation only adds whole waves."""
    gpu = load_gpu(gpu_id)
    for dtype in _supported(gpu):
        base = _gemms(dtype)
        for axis in range(4):
            grown = []
            for k in base:
                d = list(k.dims)
                if not (axis == 0 and k.family is OpFamily.LINEAR):
                    d[axis] += int(RNG.choice([1, 7, 64, 300]))
                grown.append(KernelSpec(k.family, tuple(d), dtype))
            assert np.all(MODEL.predict_s(grown, gpu) >= MODEL.predict_s(base, gpu))


@pytest.mark.parametrize("gpu_id", [g for g in GPU_IDS if has_flash_attention(load_gpu(g))])
def test_longer_or_more_attention_is_never_faster(gpu_id: str) -> None:
    """BH, S_q and S_kv. The head dim is left out: the backward's hdim-128 -> 192 tile switch
    (64x128 -> 64x64 key tiles) doubles the CTAs, which is faster when under one wave."""
    gpu = load_gpu(gpu_id)
    for dtype in (d for d in (Dtype.FP16, Dtype.BF16) if d in gpu.peak_flops_per_s):
        base = _attention(dtype)
        for axis in range(3):
            grown = []
            for k in base:
                d = list(k.dims)
                d[axis] += int(RNG.choice([1, 33, 500]))
                grown.append(KernelSpec(k.family, tuple(d), dtype, k.op))
            assert np.all(MODEL.predict_s(grown, gpu) >= MODEL.predict_s(base, gpu))


def _scaled(gpu: GPUSpec, *, bw: float = 1.0, sms: float = 1.0, peak: float = 1.0) -> GPUSpec:
    num_sms = round(gpu.num_sms * sms)
    f = peak * num_sms / gpu.num_sms  # more SMs bring their FLOPs: the same rate per SM
    return gpu.model_copy(
        update={
            "hbm_bw_bytes_per_s": gpu.hbm_bw_bytes_per_s * bw,
            "num_sms": num_sms,
            "peak_flops_per_s": {d: v * f for d, v in gpu.peak_flops_per_s.items()},
        }
    )


@pytest.mark.parametrize("gpu_id", GPU_IDS)
@pytest.mark.parametrize("change", [{"bw": 1.3}, {"sms": 1.25}, {"peak": 1.2}, {"sms": 2.0}])
def test_a_bigger_gpu_is_never_slower(gpu_id: str, change: dict[str, float]) -> None:
    gpu = load_gpu(gpu_id)
    bigger = _scaled(gpu, **change)
    for dtype in _supported(gpu):
        kernels = _gemms(dtype, 60)
        if dtype in (Dtype.FP16, Dtype.BF16) and has_flash_attention(gpu):
            kernels += _attention(dtype, 20)
        # 1e-12: peak x SMs / SMs rounds in the last bit where the per-SM rate is unchanged
        assert np.all(
            MODEL.predict_s(kernels, bigger) <= MODEL.predict_s(kernels, gpu) * (1 + 1e-12)
        )


@pytest.mark.parametrize("gpu_id", GPU_IDS)
def test_narrower_dtypes_are_faster_on_large_gemms(gpu_id: str) -> None:
    """fp8 >= bf16, fp16 >= tf32 on the tensor cores; tf32 (tensor) >= fp32 (roofline bound of
    the CUDA cores, which no fp32 forecast beats)."""
    gpu = load_gpu(gpu_id)
    for dims in ((1, 8192, 8192, 8192), (16, 2048, 2048, 2048), (1, 16384, 4096, 12288)):
        tflops = {}
        for d in _supported(gpu):
            k = KernelSpec(OpFamily.BMM, dims, d)
            tflops[d] = k.flops() / MODEL.predict_s([k], gpu)[0]
        tflops[Dtype.FP32] = gpu.peak_for(Dtype.FP32)
        chain = [Dtype.FP8, Dtype.BF16, Dtype.TF32, Dtype.FP32]
        present = [tflops[d] for d in chain if d in tflops]
        assert all(a >= b for a, b in itertools.pairwise(present)), (gpu_id, dims, tflops)
        if Dtype.FP16 in tflops:
            assert tflops[Dtype.FP16] >= tflops.get(Dtype.TF32, tflops[Dtype.FP32])


@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128, 160, 192, 256])
def test_attention_flops_closed_form(head_dim: int) -> None:
    dims = (48, 1024, 3072, head_dim)
    fwd = KernelSpec(OpFamily.ATTENTION, dims, Dtype.BF16, "attention")
    bwd = KernelSpec(OpFamily.ATTENTION, dims, Dtype.BF16, "attention_bwd")
    assert fwd.flops() == 4 * 48 * 1024 * 3072 * head_dim
    assert bwd.flops() == 2.5 * fwd.flops()
    assert np.all(MODEL.predict_s([fwd, bwd], load_gpu("a100-sxm4-80gb")) > 0)


def test_attention_errors_name_the_field() -> None:
    gpu = load_gpu("a100-sxm4-80gb")
    with pytest.raises(TensorCoreError, match=r"^head dim 257: .*at most 256"):
        MODEL.predict_s([KernelSpec(OpFamily.ATTENTION, (1, 64, 64, 257), Dtype.FP16)], gpu)
    with pytest.raises(TensorCoreError, match=r"^dtype fp32: .*use fp16 or bf16"):
        MODEL.predict_s([KernelSpec(OpFamily.ATTENTION, (1, 64, 64, 64), Dtype.FP32)], gpu)
    with pytest.raises(TensorCoreError, match=r"^op add: .*auto latency model"):
        MODEL.predict_s([KernelSpec(OpFamily.ELEMENTWISE, (1, 64), Dtype.FP16, "add")], gpu)


@pytest.mark.parametrize(
    ("gpu", "dtype", "has"),
    [
        ("a100-sxm4-80gb", "fp8", "bf16, fp16, fp32, tf32"),
        ("v100-sxm2-32gb", "fp8", "fp16, fp32"),
        ("t4", "fp8", "fp16, fp32"),
        ("v100-sxm2-32gb", "bf16", "fp16, fp32"),
        ("t4", "bf16", "fp16, fp32"),
        ("p100-pcie-16gb", "bf16", "fp16, fp32"),
    ],
)
def test_unsupported_dtype_is_one_line_naming_dtype_and_the_choices(
    capsys: pytest.CaptureFixture[str], gpu: str, dtype: str, has: str
) -> None:
    code, out, err = _run(
        capsys, "--gpu", gpu, "--op", "gemm", "--dims", "512,512,512", "--dtype", dtype
    )
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"dtype {dtype}" in err and has in err


def test_attention_cli_errors_name_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--gpu", "a100-sxm4-80gb", "--op", "attention")
    code, _, err = _run(capsys, *args, "--dims", "8,512,512,320", "--dtype", "fp16")
    assert code == 2 and "head dim 320" in err and len(err.strip().splitlines()) == 1
    code, _, err = _run(capsys, *args, "--dims", "8,512,512,64", "--dtype", "tf32")
    assert code == 2 and "dtype tf32" in err and "fp16 or bf16" in err


def test_predict_help_says_what_attention_dims_are_and_which_ops_are_causal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["kernels", "predict", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "BH,S_q,S_kv,D" in text and "M,N,K for gemm" in text
    assert "attention_bwd non-causal" in text and "attention_causal_bwd causal" in text
    assert "fp8" in text  # the dtypes the default (auto) model takes, not 'fp32 (tile-mlp)'


@pytest.mark.parametrize(("gpu", "dtype"), [("h200-sxm-141gb", "fp8"), ("a100-sxm4-80gb", "bf16")])
def test_gemm_json_is_latency_and_tflops_bit_identical(
    capsys: pytest.CaptureFixture[str], gpu: str, dtype: str
) -> None:
    args = ("--gpu", gpu, "--op", "gemm", "--dims", "1000,3000,777", "--dtype", dtype, "--json")
    code, first, _ = _run(capsys, *args)
    _, second, _ = _run(capsys, *args)
    assert code == 0 and first == second
    got = json.loads(first)
    assert set(got) == {"latency_s", "tflops"}
    assert got["tflops"] == pytest.approx(2 * 1000 * 3000 * 777 / got["latency_s"] / 1e12)
    assert got["tflops"] * 1e12 <= load_gpu(gpu).peak_for(Dtype(dtype))
