"""Causal flash attention (ops ``attention_causal``, ``attention_causal_bwd``): FLOPs of the
unmasked pairs, FA2's visited tiles, never slower than non-causal, and the Megatron decoders
run it (BERT's encoder does not)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from forecast.flash_attention import Overlap, attention_kernel_s, causal_sweeps
from forecast.flash_tiles import SMRates, backward_counts, forward_counts
from forecast.gpus import load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily, causal_pairs
from forecast.predict import load_latency_model
from forecast.tensor_core import TensorCoreModel
from simulator import inventory_megatron
from simulator.e2e import predict_run
from simulator.errors import ConfigError
from simulator.models import load_model
from simulator.opgraph import Workload, build_ops

A100, H200 = "a100-sxm4-80gb", "h200-sxm-141gb"
PAIRS = {"attention": "attention_causal", "attention_bwd": "attention_causal_bwd"}


def _attn(dims: tuple[int, int, int, int], op: str) -> KernelSpec:
    return KernelSpec(OpFamily.ATTENTION, dims, Dtype.BF16, op)


def _mask(s_q: int, s_kv: int) -> np.ndarray:
    """FA2's causal mask, aligned to the bottom right: row r sees keys 0 .. r + s_kv - s_q."""
    return np.tril(np.ones((s_q, s_kv), dtype=bool), k=s_kv - s_q)


@pytest.mark.parametrize("s_q,s_kv", [(1, 1), (7, 7), (8, 13), (13, 8), (1, 9), (9, 1)])
def test_flops_count_the_unmasked_pairs(s_q: int, s_kv: int) -> None:
    pairs = int(_mask(s_q, s_kv).sum())
    assert causal_pairs(s_q, s_kv) == pairs
    fw, bw = (
        _attn((3, s_q, s_kv, 16), "attention_causal"),
        _attn((3, s_q, s_kv, 16), "attention_causal_bwd"),
    )
    assert fw.flops() == 4 * 3 * pairs * 16
    assert bw.flops() == 2.5 * fw.flops()
    assert fw.bytes() == _attn((3, s_q, s_kv, 16), "attention").bytes()  # operands read once
    assert bw.bytes() == _attn((3, s_q, s_kv, 16), "attention_bwd").bytes()


def test_square_flops_are_half_plus_the_diagonal() -> None:
    s, bh, d = 4096, 8, 128
    full = _attn((bh, s, s, d), "attention").flops()
    causal = _attn((bh, s, s, d), "attention_causal").flops()
    assert causal == full / 2 + 4 * bh * s * d / 2  # half the S x S pairs plus half the diagonal


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize(
    "s_q,s_kv", [(1000, 1000), (256, 1024), (1024, 256), (4096, 4096), (77, 300)]
)
@pytest.mark.parametrize("backward", [False, True])
def test_sweeps_are_the_blocks_with_an_unmasked_pair(
    head_dim: int, s_q: int, s_kv: int, backward: bool
) -> None:
    """FA2's loop bounds visit exactly the block pairs that hold an unmasked element."""
    rates = load_rates(A100)
    counts = backward_counts(head_dim) if backward else forward_counts(head_dim, rates)
    mask = _mask(s_q, s_kv)
    if backward:  # CTAs own key blocks (tile_rows), sweep query blocks (tile_cols)
        mask, rows, cols = mask.T, counts.tile_rows, counts.tile_cols
    else:
        rows, cols = counts.tile_rows, counts.tile_cols
    expect = [
        sum(bool(mask[i : i + rows, j : j + cols].any()) for j in range(0, mask.shape[1], cols))
        for i in range(0, mask.shape[0], rows)
    ]
    assert causal_sweeps(s_q, s_kv, counts, backward=backward) == expect


def load_rates(gpu_id: str) -> SMRates:
    from forecast.tensor_core import load_params, sm_rates

    return sm_rates(load_gpu(gpu_id), Dtype.BF16, load_params())


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("n", [1, 2, 5, 16])
@pytest.mark.parametrize("op", ["attention", "attention_bwd"])
def test_square_compute_is_n_plus_1_over_2n(head_dim: int, n: int, op: str) -> None:
    """Without launch and DRAM time, S_q = S_kv = n blocks (of the larger tile side) and one
    CTA per SM per head block: the causal kernel runs (n + 1) / (2n) of the non-causal one's
    tiles."""
    rates = load_rates(A100)
    compute_only = SMRates(
        rates.clock_hz,
        rates.mma_flops_per_clk,
        rates.fp32_lanes,
        100,
        rates.smem_bytes_per_sm,
        math.inf,
    )
    overlap = Overlap(2.0, 0.8, 0.0)
    bwd = op == "attention_bwd"
    counts = backward_counts(head_dim) if bwd else forward_counts(head_dim, compute_only)
    block = max(counts.tile_rows, counts.tile_cols)  # the other block size divides it
    dims = (100, block * n, block * n, head_dim)
    full = attention_kernel_s(_attn(dims, op), compute_only, overlap)
    causal = attention_kernel_s(_attn(dims, PAIRS[op]), compute_only, overlap)
    assert causal / full == pytest.approx((n + 1) / (2 * n), rel=1e-12)


@pytest.mark.parametrize("gpu_id", [A100, H200])
def test_causal_never_slower_and_about_half_at_length(gpu_id: str) -> None:
    gpu, model = load_gpu(gpu_id), TensorCoreModel()
    shapes = [
        (bh, s_q, s_kv, d)
        for bh in (1, 7, 64, 333)
        for s_q, s_kv in ((1, 1), (128, 128), (500, 2000), (2000, 500), (4096, 4096), (8192, 8192))
        for d in (32, 64, 80, 128, 256)
    ]
    for op, causal_op in PAIRS.items():
        full = model.predict_s([_attn(s, op) for s in shapes], gpu)
        causal = model.predict_s([_attn(s, causal_op) for s in shapes], gpu)
        assert np.all(causal <= full), [
            s for s, c, f in zip(shapes, causal, full, strict=True) if c > f
        ]
    # long sequences: the tiles dominate the fixed costs, about half the time remains
    for op, causal_op in PAIRS.items():
        dims = (gpu.num_sms, 16384, 16384, 128)
        ratio = (
            model.predict_s([_attn(dims, causal_op)], gpu)[0]
            / model.predict_s([_attn(dims, op)], gpu)[0]
        )
        assert ratio == pytest.approx(129 / 256, rel=0.02)  # 128 blocks of 128 rows


def test_non_causal_forecast_unchanged() -> None:
    """The non-causal ops keep their closed form: ceil(CTAs / SMs) whole sweeps."""
    rates = load_rates(A100)
    overlap = Overlap(2.0, 0.8, 0.0)
    compute_only = SMRates(
        rates.clock_hz,
        rates.mma_flops_per_clk,
        rates.fp32_lanes,
        108,
        rates.smem_bytes_per_sm,
        math.inf,
    )
    from forecast.flash_attention import cycles_per_element

    counts = forward_counts(128, compute_only)
    t = attention_kernel_s(_attn((50, 1000, 3000, 128), "attention"), compute_only, overlap)
    ctas = 50 * math.ceil(1000 / 128)
    clk = math.ceil(ctas / 108) * 128 * (math.ceil(3000 / 64) * 64)
    assert t == clk * cycles_per_element(counts, compute_only, overlap) / rates.clock_hz


@pytest.mark.parametrize("model_id", ["gpt3-175b", "llama3-70b"])
def test_megatron_decoders_run_causal_and_only_attention_drops(
    model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, gpu = load_model(model_id), load_gpu(H200)
    run = Workload(batch=1, seq=2048, mode="train", framework="megatron", dtype=Dtype.BF16)
    latency = load_latency_model("auto")
    ops = {
        op.kernel.op for op in build_ops(model, run).ops if op.kernel.family is OpFamily.ATTENTION
    }
    assert ops == {"attention_causal", "attention_causal_bwd"}
    causal = predict_run(model, gpu, run, latency)
    plain = inventory_megatron.flash_attention
    monkeypatch.setattr(
        inventory_megatron, "flash_attention", lambda z, causal: plain(z, causal=False)
    )
    full = predict_run(model, gpu, run, latency)
    assert causal.by_family_ms.keys() == full.by_family_ms.keys()
    for family, ms in full.by_family_ms.items():
        if family == "attention":
            assert 0.45 * ms < causal.by_family_ms[family] < 0.6 * ms
        else:
            assert causal.by_family_ms[family] == ms, family
    assert causal.optimizer_ms == full.optimizer_ms
    assert causal.memory_gib == full.memory_gib
    assert causal.e2e_ms < full.e2e_ms


def test_bert_encoder_stays_non_causal() -> None:
    try:
        bert = load_model("bert_large")  # a NeuSight model (../shared data)
    except ConfigError:
        pytest.skip("no NeuSight BERT config")
    run = Workload(batch=2, seq=512, mode="train", framework="megatron", dtype=Dtype.FP16)
    kernels = build_ops(bert, run).ops
    ops = {op.kernel.op for op in kernels if op.kernel.family is OpFamily.ATTENTION}
    assert ops == {"attention", "attention_bwd"}


def test_fp8_training_runs_its_flash_attention_in_bf16() -> None:
    """TransformerEngine's default fp8 recipe runs the GEMMs in fp8 and attention in bf16: the
    Megatron inventory in fp8 emits the bf16 causal FA2 kernels (it emitted fp8 GEMM-shaped
    non-causal stand-ins), so fp8 and bf16 runs price attention alike."""
    model = load_model("llama3-8b")
    kernels = {}
    for dtype in (Dtype.FP8, Dtype.BF16):
        run = Workload(batch=1, seq=1024, mode="train", framework="megatron", dtype=dtype)
        graph = build_ops(model, run)
        kernels[dtype] = sorted(
            (op.kernel.op, op.kernel.dtype.value, op.count)
            for op in graph.ops
            if op.kernel.family is OpFamily.ATTENTION
        )
    assert kernels[Dtype.FP8] == kernels[Dtype.BF16]
    assert {k[:2] for k in kernels[Dtype.FP8]} == {
        ("attention_causal", "bf16"),
        ("attention_causal_bwd", "bf16"),
    }
