"""Tensor-core forecasts against each other and against physics, alone and inside a stream.

A narrower dtype is never slower than a wider one where its catalog peak is at least the
wider one's (fp8 <= bf16 = fp16 <= tf32 <= fp32), neither for a kernel alone nor inside a
whole model's stream; a dtype the GPU has no peak for is one error line, on every route;
doubling any GEMM or attention dimension is never faster; a GPU with more SMs (and their
FLOPs) is never slower; no forecast is above the catalog peak or under the FLOP roofline.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from forecast.flash_attention import has_flash_attention
from forecast.gpus import GPUSpec, list_gpus, load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.predict import LatencyModel, load_latency_model
from forecast.roofline import RooflineModel
from forecast.stream import stream_table
from forecast.tensor_core import TensorCoreModel
from simulator.cli import main

GPU_IDS = [g if isinstance(g, str) else g.id for g in list_gpus()]
TC = TensorCoreModel()
CHAINS = (
    (Dtype.FP8, Dtype.BF16, Dtype.TF32, Dtype.FP32),
    (Dtype.FP8, Dtype.FP16, Dtype.TF32, Dtype.FP32),
)
SIZES = (1, 3, 16, 64, 100, 257, 512, 1000, 4096)
ROWS = (("add", OpFamily.ELEMENTWISE), ("softmax", OpFamily.SOFTMAX))


def _auto() -> LatencyModel:
    try:
        return load_latency_model("auto")
    except ValueError:
        pytest.skip("no trained weights")


def _gemm_shapes(n: int = 150) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(9)
    b = rng.choice([1, 2, 8, 32], size=n)
    mnk = rng.choice(SIZES, size=(n, 3))
    return [(int(x), *(int(y) for y in row)) for x, row in zip(b, mnk, strict=True)]


def _chains(gpu: GPUSpec, *, fp32: bool = True) -> list[list[Dtype]]:
    """Narrow-to-wide dtype chains of the GPU's peaks (bf16 and fp16 each in one)."""
    chains = [[d for d in c if d in gpu.peak_flops_per_s] for c in CHAINS]
    return [[d for d in c if fp32 or d is not Dtype.FP32] for c in chains]


def _dtypes(gpu: GPUSpec, *, fp32: bool = True) -> list[Dtype]:
    return sorted({d for c in _chains(gpu, fp32=fp32) for d in c})


# the GPUs with a tensor-core dtype (the P4 has none)
TC_GPU_IDS = [g for g in GPU_IDS if _dtypes(load_gpu(g), fp32=False)]


def _assert_ordered(times: dict[KernelSpec, float], gpu: GPUSpec, *, fp8: bool = True) -> None:
    """Times of one shape in several dtypes: each chain non-decreasing (fp8 left out where
    ``fp8`` is false), and bf16 = fp16 where the catalog gives them the same peak."""
    by_dtype = {k.dtype: t for k, t in times.items() if fp8 or k.dtype is not Dtype.FP8}
    for chain in _chains(gpu):
        seq = [by_dtype[d] for d in chain if d in by_dtype]
        assert all(a <= b for a, b in itertools.pairwise(seq)), (next(iter(times)), by_dtype)
    peaks = gpu.peak_flops_per_s
    if Dtype.BF16 in by_dtype and Dtype.FP16 in by_dtype and peaks[Dtype.BF16] == peaks[Dtype.FP16]:
        assert by_dtype[Dtype.BF16] == by_dtype[Dtype.FP16]


def test_the_reported_case_bf16_linear_in_a_stream_is_not_slower_than_fp32() -> None:
    """A100-SXM4-80GB linear 1,256,256,256 read 2.36 us in bf16 and 1.72 us in fp32: the fp32
    twin sits at the data's 40-100 us floor and costs its roofline, the bf16 one sat just
    above the tensor-core model's 6 us floor, where the stream's blend triples the excess."""
    gpu = load_gpu("a100-sxm4-80gb")
    ks = [KernelSpec(OpFamily.LINEAR, (1, 256, 256, 256), d) for d in (Dtype.BF16, Dtype.FP32)]
    table = stream_table(ks, gpu, _auto())
    assert table[ks[1]] == pytest.approx(RooflineModel().predict_s([ks[1]], gpu)[0])
    assert table[ks[0]] <= table[ks[1]]


@pytest.mark.parametrize(
    "gpu_id", ["a100-sxm4-80gb", "h200-sxm-141gb", "l4", "mi300x", "t4", "mi100"]
)
def test_narrower_dtypes_are_never_slower_in_a_stream(gpu_id: str) -> None:
    gpu = load_gpu(gpu_id)
    dtypes = _dtypes(gpu)
    kernels = [
        KernelSpec(fam, s if fam is OpFamily.BMM else (1, *s[1:]), d)
        for s in _gemm_shapes()
        for fam in (OpFamily.BMM, OpFamily.LINEAR)
        for d in dtypes
    ]
    kernels += [
        KernelSpec(fam, (n // 256 + 1, 256), d, op)
        for n in (2**10, 2**14, 2**18, 2**20, 2**22)
        for op, fam in ROWS
        for d in dtypes
    ]
    table = stream_table(kernels, gpu, _auto())
    by_shape: dict[object, dict[KernelSpec, float]] = {}
    for k, t in table.items():
        by_shape.setdefault((k.family, k.dims, k.op), {})[k] = t
    for times in by_shape.values():
        _assert_ordered(times, gpu)


def test_a_tiny_model_in_a_narrower_dtype_is_not_slower(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """tiny-gpt inference on an A100 read 12.2 us in fp32 and 17.7 us in bf16 (33.1 in tf32)."""
    _auto()
    got = {}
    for d in ("fp32", "tf32", "bf16", "fp16"):
        argv = ["predict", "--model", "tiny-gpt", "--gpu", "a100-sxm4-80gb", "--batch", "1"]
        assert main([*argv, "--seq", "32", "--mode", "inf", "--dtype", d, "--json"]) == 0
        got[d] = json.loads(capsys.readouterr().out)["e2e_ms"]
    assert 0 < got["bf16"] == got["fp16"] <= got["tf32"] <= got["fp32"]


@pytest.mark.parametrize("gpu_id", TC_GPU_IDS)
def test_narrower_dtypes_are_never_slower_alone(gpu_id: str) -> None:
    """fp8's k-tile of 128 (Hopper) or 64 (Ada) elements padded a short reduction to twice
    bf16's and paid the FP32 promotion on it: H200 bmm 8,8192,1,257 read 4% slower in fp8.
    Inherent and left out: a reduction of at most 64 that bf16 splits into slices of 16 or
    less, where fp8's shortest MMA (k = 32) takes as long as bf16's (k = 16) and fp8 adds the
    promotion (a few ns on 5.5 us kernels)."""
    gpu = load_gpu(gpu_id)
    dtypes = _dtypes(gpu, fp32=False)
    shapes = [*_gemm_shapes(), (8, 8192, 1, 257), (1, 4096, 64, 4096), (16, 2048, 100, 2048)]
    kernels = [KernelSpec(OpFamily.BMM, s, d) for s in shapes for d in dtypes]
    times = TC.predict_s(kernels, gpu)
    for i in range(0, len(kernels), len(dtypes)):
        one_shape = dict(zip(kernels[i : i + len(dtypes)], times[i:], strict=False))
        _assert_ordered(one_shape, gpu, fp8=kernels[i].dims[2] > 64)


def test_fp8_short_reduction_runs_the_16_bit_k_tile_depth() -> None:
    """Closed form: on Hopper a reduction of 64 is one 64-deep k-tile in bf16 and, with the
    16-bit depth, in fp8 too; compute-bound (one huge wave, DRAM made free), fp8's main loop
    is bf16's x bf16 rate / fp8 rate (promotion included), so it is faster, not 1.23x slower."""
    h200 = load_gpu("h200-sxm-141gb")
    gpu = h200.model_copy(update={"hbm_bw_bytes_per_s": 1e30})
    dims = (1, 16384, 64, 16384)
    fp8, bf16 = (KernelSpec(OpFamily.BMM, dims, d) for d in (Dtype.FP8, Dtype.BF16))
    t8, t16 = TC.predict_s([fp8, bf16], gpu) - TC.params.launch_s
    assert t8 < t16


def test_a_dtype_the_gpu_lacks_is_one_error_line_on_every_route(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An fp8 add on an A100 and a bf16 softmax on a T4 were forecast (3 us) though the help
    says the GPU must have a catalog peak for the dtype, as their GEMMs require."""
    for gpu, op, dtype, has in (
        ("a100-sxm4-80gb", "add", "fp8", "bf16, fp16, fp32, tf32"),
        ("t4", "softmax", "bf16", "fp16, fp32"),
        ("v100-sxm2-32gb", "layernorm", "fp8", "fp16, fp32"),
    ):
        argv = ["kernels", "predict", "--gpu", gpu, "--op", op, "--dims", "4,1024"]
        assert main([*argv, "--dtype", dtype, "--json"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert f"dtype {dtype}: {gpu} has no {dtype} peak" in err and has in err


def _doubled(k: KernelSpec, axis: int) -> KernelSpec:
    return KernelSpec(k.family, tuple(x * 2 if i == axis else x for i, x in enumerate(k.dims)),
                      k.dtype, k.op)  # fmt: skip


def _more_sms(gpu: GPUSpec, factor: float) -> GPUSpec:
    sms = round(gpu.num_sms * factor)
    f = sms / gpu.num_sms  # the added SMs bring their FLOPs: same rate per SM, same clock
    peaks = {d: v * f for d, v in gpu.peak_flops_per_s.items()}
    return gpu.model_copy(update={"num_sms": sms, "peak_flops_per_s": peaks})


@pytest.mark.parametrize("gpu_id", TC_GPU_IDS)
def test_doubling_work_or_sms_and_the_peak_and_roofline_bounds(gpu_id: str) -> None:
    """Doubling B, M, N or K of a GEMM, or BH, S_q or S_kv of an attention, is never faster
    (wave quantisation may leave it equal); 1.5x or 2x the SMs is never slower; achieved
    FLOP/s never exceed the dtype's peak, so no kernel beats its FLOP roofline."""
    gpu = load_gpu(gpu_id)
    kernels = [
        KernelSpec(OpFamily.BMM, s, d) for s in _gemm_shapes(60) for d in _dtypes(gpu, fp32=False)
    ]
    axes = {OpFamily.BMM: range(4), OpFamily.ATTENTION: range(3)}
    for d in (Dtype.FP16, Dtype.BF16):
        if d in gpu.peak_flops_per_s and has_flash_attention(gpu):  # FA2: sm80+, MI200/MI300
            kernels += [
                KernelSpec(OpFamily.ATTENTION, (bh, sq, skv, hd), d, op)
                for op in ("attention", "attention_bwd")
                for bh, sq, skv in ((1, 1, 1), (3, 100, 1000), (16, 2048, 512), (64, 4096, 4096))
                for hd in (64, 96, 128, 256)
            ]
    base = TC.predict_s(kernels, gpu)
    for fam, ax in itertools.chain.from_iterable(((f, a) for a in r) for f, r in axes.items()):
        idx = [i for i, k in enumerate(kernels) if k.family is fam]
        grown = TC.predict_s([_doubled(kernels[i], ax) for i in idx], gpu)
        assert np.all(grown >= base[idx]), (fam, ax)
    for factor in (1.5, 2.0):
        assert np.all(TC.predict_s(kernels, _more_sms(gpu, factor)) <= base * (1 + 1e-12))
    flops = np.array([k.flops() for k in kernels])
    peaks = np.array([gpu.peak_for(k.dtype) for k in kernels])
    assert np.all(flops / base <= peaks)
    assert np.all(base >= RooflineModel().predict_s(kernels, gpu))
