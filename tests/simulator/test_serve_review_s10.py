"""Review of ``tilesim serve`` (s10): closed forms and metamorphic relations of the decode pass.

A decode pass of ``B`` sequences does ``2 B`` FLOPs per weight of every GEMM it runs (the
layers' projections, the experts a token is routed to, the output head) plus attention's
``4 B heads keys head_dim`` a layer (QK^T and AV, one query row each). An MoE layer under
balanced routing spreads ``B k`` routed rows over its experts: ``B k / E`` rows each when
``B k >= E``, and only ``B k`` experts of one row each when ``B k < E`` (Mixtral at batch 1
runs 2 of its 8 experts and reads only their weights).
"""

from __future__ import annotations

import json

import pytest

from forecast.gpus import load_gpu
from forecast.kernels import GEMM_FAMILIES, Dtype, OpFamily
from simulator.cli import main
from simulator.latency import latency_model_for
from simulator.memory import gemm_weights
from simulator.models import ModelSpec, load_model
from simulator.opgraph import OpGraph, Workload, build_ops
from simulator.serve import forecast_passes, kv_cache_bytes, serve_forecast
from simulator.serve_request import ServeRequest

H100 = "h100-sxm5-80gb"
DERATED = latency_model_for("roofline-derated")


def _decode(m: ModelSpec, batch: int, past: int, framework: str, dtype: Dtype) -> OpGraph:
    run = Workload(
        batch=batch,
        seq=1,
        past=past,
        mode="inf",
        framework=framework,
        dtype=dtype,
        kv_cache=True,
    )
    return build_ops(m, run)


def _flops(graph: OpGraph) -> tuple[float, float]:
    """GEMM FLOPs of the weights (linear, no bias add) and of attention (bmm or FA2)."""
    weights = attention = 0.0
    for op in graph.ops:
        k = op.kernel
        if k.family is OpFamily.LINEAR:
            b, rows, n, cols = k.dims
            weights += op.count * 2.0 * b * rows * n * cols
        elif k.family in GEMM_FAMILIES or k.family is OpFamily.ATTENTION:
            attention += op.count * k.flops()
    return weights, attention


def _gemm_weights_per_token(m: ModelSpec) -> float:
    """Weights a token multiplies: each layer's Q, K, V and output projections, the FFN of
    each of its ``k`` routed experts (one FFN when dense) and the router, then the head."""
    h, d = m.hidden_size, m.dhead
    attention = h * (m.num_heads + 2 * m.kv_heads) * d + m.num_heads * d * h
    ffn = (3 if m.activation == "swiglu" else 2) * h * m.ffn_hidden_size
    moe = m.num_experts > 1
    layer = (
        attention + (m.experts_per_token if moe else 1) * ffn + (h * m.num_experts if moe else 0)
    )
    e = m.embed_width
    head = e * m.vocab_size + (2 * h * e if e != h else 0)  # OPT's projections out and in
    return m.num_layers * layer + head


@pytest.mark.parametrize("framework", ["megatron", "hf-eager"])
@pytest.mark.parametrize("model", ["tiny-gpt", "llama2-7b", "llama3-8b", "mixtral-8x7b"])
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_decode_pass_flops_closed_form(model: str, framework: str, batch: int) -> None:
    """2 x B x (non-embedding GEMM weights + head) + 4 x B x heads x keys x head_dim a layer.
    Mixtral-8x7B ran every one of its 8 experts on all B rows (B x k / E rounded up to one
    row a sequence): 3.65x the GEMM FLOPs at any batch, and at batch 1 all 45B expert
    weights read where 2 experts' are."""
    m = load_model(model)
    past = 100
    weights, attention = _flops(_decode(m, batch, past, framework, Dtype.BF16))
    assert weights == pytest.approx(2.0 * batch * _gemm_weights_per_token(m), rel=1e-12)
    keys = past + 1
    expect = 4.0 * batch * m.num_heads * keys * m.dhead * m.num_layers
    assert attention == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("framework", ["megatron", "hf-eager"])
def test_moe_decode_runs_only_the_routed_experts(framework: str) -> None:
    """Uniform routing of B tokens x 2 over Mixtral's 8 experts reaches 8 (1 - 0.75^B) of
    them on average, the nearest whole number run (an expert no token reaches launches no
    GEMM): batch 1 runs 2 experts of one row; batch 3 (4.63 expected) 5 experts sharing its
    6 rows, one of 2 rows and four of 1 (it ran 6 of one row, min(E, B k)); batch 64 all 8
    at 64 x 2 / 8 = 16 rows; a prefill of 4 x 512 tokens 8 x 512 rows (unchanged)."""
    m = load_model("mixtral-8x7b")
    f = m.ffn_hidden_size
    for batch, rows in [(1, {1: 2}), (3, {2: 1, 1: 4}), (64, {16: 8})]:
        graph = _decode(m, batch, 100, framework, Dtype.BF16)
        downs = [op for op in graph.ops if op.kernel.dims[2:] == (f, m.hidden_size)]
        run: dict[int, int] = {}
        for op in downs:
            run[op.kernel.dims[1]] = run.get(op.kernel.dims[1], 0) + op.count
        assert run == {r: n * m.num_layers for r, n in rows.items()}
    prefill = Workload(batch=4, seq=512, mode="inf", framework=framework, dtype=Dtype.BF16)
    downs = [o for o in build_ops(m, prefill).ops if o.kernel.dims[2:] == (f, m.hidden_size)]
    assert {op.kernel.dims[1] for op in downs} == {4 * 512 * 2 // 8}
    assert sum(op.count for op in downs) == 8 * m.num_layers


def test_moe_batch_one_decode_reads_the_active_weights_not_all() -> None:
    """Mixtral-8x7B at batch 1 on an H100 (roofline-derated: kernels at 85% of HBM): a
    decode pass reads the 12.9B parameters a token uses (26 GB in bf16, 7.7 ms at 3.35 TB/s),
    not all 46.7B (93 GB, 27.9 ms), so it is under 1.5x the active read and far under the
    whole read; it was 33 ms."""
    m, gpu = load_model("mixtral-8x7b"), load_gpu(H100)
    expert = 3 * m.hidden_size * m.ffn_hidden_size
    active = m.num_params() - m.num_layers * (m.num_experts - m.experts_per_token) * expert
    active_ms = active * 2 / gpu.hbm_bw_bytes_per_s * 1e3
    whole_ms = m.num_params() * 2 / gpu.hbm_bw_bytes_per_s * 1e3
    p = forecast_passes(m, gpu, ServeRequest(batch=1, prompt=64, gen=2), DERATED)
    decode_ms = p.seconds[1] * 1e3
    assert active_ms <= decode_ms < 1.5 * active_ms < whole_ms


def test_fp8_serving_keeps_a_bf16_kv_cache_under_megatron() -> None:
    """fp8 serving with Megatron's kernels: 1-byte weights, but attention runs in bf16
    (TransformerEngine's fp8 recipe; vLLM's fp8 weights likewise keep a bf16 cache unless
    told --kv-cache-dtype fp8), so the cache FA2 reads is bf16: its bytes and its write
    kernel were fp8 (half the memory the attention kernel reads)."""
    m, gpu = load_model("llama3-8b"), load_gpu(H100)
    fp8 = ServeRequest(batch=16, prompt=1024, gen=256, dtype=Dtype.FP8)
    bf16 = fp8.model_copy(update={"dtype": Dtype.BF16})
    assert kv_cache_bytes(m, fp8) == kv_cache_bytes(m, bf16) == 2 * 32 * 8 * 128 * 2 * 16 * 1280
    graph = _decode(m, 4, 100, "megatron", Dtype.FP8)
    writes = {op.kernel for op in graph.ops if op.name.endswith("kv_cache_write")}
    attention = {op.kernel for op in graph.ops if op.kernel.family is OpFamily.ATTENTION}
    assert {k.dtype for k in writes} == {k.dtype for k in attention} == {Dtype.BF16}
    res = serve_forecast(m, gpu, fp8, DERATED)
    # 1 byte a GEMM weight, 2 the token table, head and norms (bf16 ops under TE's fp8)
    gemm = gemm_weights(m, m.num_layers)[0]
    assert res.weights_gib * 2**30 == pytest.approx(gemm + 2 * (m.num_params() - gemm))
    assert res.kv_cache_gib * 2**30 == kv_cache_bytes(m, bf16)
    # HF eager runs its eager attention in the workload's dtype: its cache is fp8 there
    eager = fp8.model_copy(update={"framework": "hf-eager"})
    assert kv_cache_bytes(m, eager) * 2 == kv_cache_bytes(m, bf16)


def test_batch_past_the_modelled_tokens_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A batch whose last decode pass attends over more than 2^40 keys was a pydantic
    traceback (exit 1); it is one line naming --batch (exit 2)."""
    args = ["serve", "--model", "llama3-8b", "--gpu", H100, "--batch", "1000000000"]
    args += ["--prompt", "2048", "--gen", "2", "--latency-model", "roofline-derated"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--batch 1000000000" in err and len(err.strip().splitlines()) == 1


def test_same_command_same_json_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["serve", "--model", "mixtral-8x7b", "--server", "dgx-h100", "--tp", "2"]
    args += ["--batch", "3", "--prompt", "100", "--gen", "300", "--json"]
    args += ["--latency-model", "roofline-derated"]
    outs = []
    for _ in range(2):
        assert main(args) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and json.loads(outs[0])["comm_ms"] > 0


def test_tensor_parallel_moe_decode_is_faster_on_nvlink() -> None:
    """A weight-bound decode (Mixtral-8x7B, batch 1) over NVLink: each GPU reads 1/tp of the
    active weights, so tp 2, 4 and 8 are each faster per pass than the one before."""
    from topologies.catalog import load_cluster

    m, gpu = load_model("mixtral-8x7b"), load_gpu(H100)
    times = []
    for tp in (1, 2, 4, 8):
        cluster = load_cluster("dgx-h100", gpus=tp) if tp > 1 else None
        req = ServeRequest(batch=1, prompt=64, gen=2, tp=tp)
        times.append(forecast_passes(m, gpu, req, DERATED, cluster=cluster).seconds[1])
    assert times == sorted(times, reverse=True)
