"""``tilesim serve``: prefill plus per-token decode with a KV cache on one GPU.

Closed forms: the KV cache's bytes, the decode pass's kernels (every GEMM on ``batch`` rows,
attention over ``past + 1`` keys, the cache append, the head over the last token), a decode
pass never faster than reading the weights once, the largest batch that fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simulator.serve as serve
import simulator.serve_parallel as serve_parallel
import simulator.serve_request as serve_request
from forecast.gpus import load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from simulator.cli import main
from simulator.errors import ConfigError
from simulator.latency import latency_model_for
from simulator.models import load_model
from simulator.opgraph import Phase, Workload, build_ops
from simulator.serve import kv_cache_bytes, serve_forecast
from simulator.serve_request import ServeRequest

H100 = "h100-sxm5-80gb"
TC = latency_model_for("auto")
DERATED = latency_model_for("roofline-derated")


def _decode(model: str, framework: str, batch: int = 4, past: int = 100) -> set[KernelSpec]:
    run = Workload(
        batch=batch,
        seq=1,
        past=past,
        mode="inf",
        framework=framework,
        dtype=Dtype.BF16,
        kv_cache=True,
    )
    return {op.kernel for op in build_ops(load_model(model), run).ops}


def test_kv_cache_bytes_closed_form() -> None:
    # Llama 3 8B: 32 layers, 8 KV heads of 128; K and V in bf16 = 131,072 bytes a token
    m = load_model("llama3-8b")
    req = ServeRequest(batch=16, prompt=1024, gen=256)
    assert kv_cache_bytes(m, req) == 2 * 32 * 8 * 128 * 2 * 16 * (1024 + 256)


def test_fused_decode_pass_kernels() -> None:
    """Llama 3 8B, batch 4, 100 cached tokens: the QKV GEMM on 4 rows, FA2's decode layout
    (4 x 8 KV heads, the 4 query heads of a group as rows, 101 keys, no mask), the K/V write
    of 4 tokens into the cache, the vocabulary head on 4 rows."""
    ks = _decode("llama3-8b", "megatron")
    h, qkv, v = 4096, (32 + 2 * 8) * 128, 128256
    assert KernelSpec(OpFamily.LINEAR, (1, 4, h, qkv), Dtype.BF16) in ks
    assert KernelSpec(OpFamily.ATTENTION, (32, 4, 101, 128), Dtype.BF16, "attention") in ks
    assert KernelSpec(OpFamily.MEMORY, (4, 2 * 8 * 128), Dtype.BF16, "copy") in ks
    assert KernelSpec(OpFamily.LINEAR, (1, 4, h, v), Dtype.BF16) in ks
    gemm_rows = {k.dims[1] for k in ks if k.family is OpFamily.LINEAR}
    assert gemm_rows == {4}


def test_eager_decode_pass_kernels() -> None:
    """HF eager: DynamicCache's torch.cat copies all 101 keys and values of each sequence,
    repeat_kv widens them to 32 heads, QK^T is one query row against 101 keys."""
    ks = _decode("llama3-8b", "hf-eager")
    assert KernelSpec(OpFamily.MEMORY, (4 * 101, 2 * 8 * 128), Dtype.BF16, "copy") in ks
    assert KernelSpec(OpFamily.MEMORY, (4 * 101, 32 * 128), Dtype.BF16, "copy") in ks
    assert KernelSpec(OpFamily.BMM, (4 * 32, 1, 128, 101), Dtype.BF16) in ks
    assert KernelSpec(OpFamily.SOFTMAX, (4 * 32, 101), Dtype.BF16) in ks
    # the first pass (prefill) keeps its K and V as the cache: no cat
    prefill = Workload(batch=4, seq=100, mode="inf", dtype=Dtype.BF16, kv_cache=True)
    cats = [op for op in build_ops(load_model("llama3-8b"), prefill).ops if "cache" in op.name]
    assert cats == []


def test_prefill_head_runs_on_the_last_token_only() -> None:
    m = load_model("llama3-8b")
    base = {"batch": 2, "seq": 64, "mode": "inf", "dtype": Dtype.BF16}
    plain = build_ops(m, Workload(**base))
    cached = build_ops(m, Workload(**base, kv_cache=True))
    rows = {o.kernel.dims[1] for o in plain.ops if o.name == "head.lm_head"}
    assert rows == {128}  # predict's inference pass: every token's logits (as the labels)
    assert {o.kernel.dims[1] for o in cached.ops if o.name == "head.lm_head"} == {2}


@pytest.mark.parametrize("framework", ["megatron", "hf-eager"])
def test_decode_never_beats_reading_the_weights(framework: str) -> None:
    """Every decode pass reads every weight once: batch-1 Llama 3 8B in bf16 on H100 is at
    least 16.06 GB / 3.35 TB/s = 4.8 ms a token, and the fused path within 1.6x of it."""
    m, gpu = load_model("llama3-8b"), load_gpu(H100)
    res = serve_forecast(m, gpu, ServeRequest(batch=1, prompt=128, gen=9, framework=framework), TC)
    floor_ms = m.num_params() * 2 / gpu.hbm_bw_bytes_per_s * 1e3
    assert res.first_decode_ms >= floor_ms
    assert res.last_decode_ms >= res.first_decode_ms  # more keys, never faster
    if framework == "megatron":
        assert res.tpot_ms <= 1.6 * floor_ms
    assert res.e2e_ms == pytest.approx(res.prefill_ms + res.decode_ms)
    assert res.tpot_ms == pytest.approx(res.decode_ms / 8)
    assert res.output_tokens_per_s == pytest.approx(9 / res.e2e_ms * 1e3)


def test_one_token_is_the_prefill_alone() -> None:
    m, gpu = load_model("tiny-gpt"), load_gpu(H100)
    res = serve_forecast(m, gpu, ServeRequest(batch=2, prompt=32, gen=1), DERATED)
    assert res.decode_ms == res.tpot_ms == 0 and res.e2e_ms == res.prefill_ms


def test_max_batch_is_the_largest_that_fits() -> None:
    m, gpu = load_model("llama3-8b"), load_gpu(H100)
    req = ServeRequest(batch=1, prompt=4096, gen=4096)
    n = serve.max_batch(m, gpu, req)
    assert n > 1

    def total_bytes(batch: int) -> float:
        return serve._memory(m, gpu, req.model_copy(update={"batch": batch})).total_bytes

    assert total_bytes(n) <= gpu.hbm_bytes < total_bytes(n + 1)
    big = serve_forecast(
        load_model("llama3-70b"), gpu, ServeRequest(batch=1, prompt=8, gen=2), DERATED
    )
    assert big.max_batch == 0 and not big.fits  # 141 GB of bf16 weights in 80 GB


def test_long_generations_interpolate_between_sampled_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m, gpu = load_model("tiny-gpt"), load_gpu(H100)
    req = ServeRequest(batch=2, prompt=16, gen=300)
    monkeypatch.setattr(serve_request, "MAX_DECODE_SAMPLES", 1000)
    exact = serve_forecast(m, gpu, req, DERATED)
    monkeypatch.setattr(serve_request, "MAX_DECODE_SAMPLES", 40)
    samples = serve_request.decode_samples(300)
    assert len(samples) == 40 and samples[::39] == [1, 299]
    approx = serve_forecast(m, gpu, req, DERATED)
    assert approx.decode_ms == pytest.approx(exact.decode_ms, rel=1e-3)
    assert approx.last_decode_ms == exact.last_decode_ms


def test_kv_cache_workloads_are_validated() -> None:
    with pytest.raises(ValueError, match="kv_cache"):
        Workload(batch=1, seq=1, past=4, mode="inf")
    with pytest.raises(ValueError, match="inference"):
        Workload(batch=1, seq=1, mode="train", kv_cache=True)
    with pytest.raises(ConfigError, match="decoder-only"):
        build_ops(load_model("switch-base-4"), Workload(batch=1, seq=8, mode="inf", kv_cache=True))


def test_cli_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["serve", "--model", "tiny-gpt", "--gpu", H100, "--batch", "2", "--prompt", "32"]
    args += ["--gen", "5", "--latency-model", "roofline-derated"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == set(serve.ServeResult.model_fields)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "time to first token" in text and "output tokens/s" in text


@pytest.mark.parametrize(
    "bad, named",
    [
        (["--batch", "0"], "--batch 0"),
        (["--gen", "-1"], "--gen -1"),
        (["--dtype", "fp9"], "--dtype fp9"),
        (["--framework", "vllm"], "--framework vllm"),
        (["--model", "switch-base-4"], "decoder-only"),
        (["--prompt", "2000"], "--prompt + --gen"),
        (["--latency-model", "tensor-core"], "--latency-model"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(
    bad: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = {"--model": "tiny-gpt", "--gpu": H100, "--batch": "1", "--prompt": "8", "--gen": "2"}
    flags.update(dict(zip(bad[::2], bad[1::2], strict=True)))
    args = ["serve", *(x for kv in flags.items() for x in kv)]
    if "--latency-model" not in flags:
        args += ["--latency-model", "roofline-derated"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1


def test_phase_of_serving_passes_is_forward_only() -> None:
    for run in serve_request.passes(ServeRequest(batch=1, prompt=8, gen=3)):
        graph = build_ops(load_model("tiny-gpt"), run)
        assert {op.phase for op in graph.ops} == {Phase.FORWARD}


def test_tensor_parallel_shard_and_collectives() -> None:
    """Llama 3 70B over 8 H100s of a DGX H100: each GPU holds 1/8 of the heads, KV heads,
    FFN and vocabulary (the norms whole), so 1/8 of the KV cache; a one-token request is the
    prefill alone, whose collectives are 2 x 80 + 1 all-reduces of its 8 x 8192 bf16
    activations and one all-gather of the last token's 128,256 logits."""
    from topologies import collective_estimate
    from topologies.catalog import load_cluster

    m, gpu, cluster = load_model("llama3-70b"), load_gpu(H100), load_cluster("dgx-h100", gpus=8)
    req = ServeRequest(batch=1, prompt=8, gen=1, tp=8)
    local = serve_parallel.shard(m, 8)
    assert (local.num_heads, local.kv_heads, local.dhead) == (8, 1, 128)
    assert local.ffn_hidden_size * 8 == m.ffn_hidden_size
    assert kv_cache_bytes(local, req) * 8 == kv_cache_bytes(m, req)
    embeddings = 2 * m.vocab_size * m.hidden_size  # untied token table and head
    layer_norms = (2 * m.num_layers + 1) * m.hidden_size
    assert local.num_params() == pytest.approx(
        (m.num_params() - layer_norms) / 8 + layer_norms, rel=1e-6
    )
    assert embeddings / 8 == local.vocab_size * local.hidden_size * 2
    res = serve_forecast(m, gpu, req, DERATED, cluster=cluster)
    ar = collective_estimate("all-reduce", 8 * 8192 * 2, range(8), cluster).time_s
    ag = collective_estimate("all-gather", 128256 * 2, range(8), cluster).time_s
    assert res.comm_ms == pytest.approx((161 * ar + ag) * 1e3)
    assert res.fits  # 141 GB of weights over 8 GPUs of 80 GB


def test_tensor_parallel_decode_is_faster_and_replicates_kv_heads() -> None:
    from topologies.catalog import load_cluster

    m = load_model("llama3-8b")
    gpu = load_gpu(H100)
    one = serve_forecast(m, gpu, ServeRequest(batch=1, prompt=64, gen=3), TC)
    eight = serve_forecast(
        m,
        gpu,
        ServeRequest(batch=1, prompt=64, gen=3, tp=8),
        TC,
        cluster=load_cluster("dgx-h100", gpus=8),
    )
    assert eight.comm_ms > 0 and eight.tpot_ms < one.tpot_ms
    # 16 GPUs of an NVL72 rack share 8 KV heads: each keeps one (vLLM replicates them)
    assert serve_parallel.shard(load_model("llama3-70b"), 16).kv_heads == 1
    with pytest.raises(ConfigError, match="do not split"):
        serve_parallel.shard(m, 3)


@pytest.mark.parametrize(
    "bad, named",
    [
        (["--tp", "2"], "--server"),
        (["--server", "dgx-h100", "--tp", "16"], "--tp 16"),
        (["--server", "dgx-h100", "--gpu", "l4"], "--gpu l4"),
        (["--server", "nope"], "nope"),
    ],
)
def test_cli_tensor_parallel_bad_input(
    bad: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["serve", "--model", "llama3-8b", "--batch", "1", "--prompt", "8", "--gen", "2"]
    args += ["--latency-model", "roofline-derated", *bad]
    if "--server" not in bad and "--gpu" not in bad:
        args += ["--gpu", H100]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1


def test_plot_batches_are_powers_of_two_that_fit_and_the_request() -> None:
    from simulator.serve_plots import plot_batches

    req = ServeRequest(batch=24, prompt=8, gen=2)
    assert plot_batches(req, 56) == [1, 2, 4, 8, 16, 24, 32, 56]
    assert plot_batches(req, 0) == [1, 24]  # nothing fits: the request is still drawn
    assert plot_batches(req.model_copy(update={"batch": 1}), 10**6)[-1] == 4096


def test_cli_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "serve.png"
    args = ["serve", "--model", "tiny-gpt", "--gpu", H100, "--batch", "2", "--prompt", "16"]
    args += ["--gen", "4", "--latency-model", "roofline-derated"]
    assert main([*args, "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {out}" in capsys.readouterr().out
    bad = tmp_path / "serve.nope"
    assert main([*args, "--plot", str(bad)]) == 2
    assert "--plot" in capsys.readouterr().err and not bad.exists()


@pytest.mark.skipif(not Path("/sys").is_dir(), reason="no /sys")
def test_plot_and_sweep_out_in_an_unwritable_folder_are_refused_before_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """/sys refuses new files even to root, whom os.access answers yes."""
    from simulator.errors import cannot_write_in

    if cannot_write_in(Path("/sys")) is None:
        pytest.skip("/sys is writable here")
    args = ["serve", "--model", "tiny-gpt", "--gpu", H100, "--batch", "1", "--prompt", "8"]
    assert main([*args, "--gen", "2", "--plot", "/sys/serve.png"]) == 2
    assert "cannot write in /sys" in capsys.readouterr().err
    assert main(["sweep", "tiny-gpt-8gpu", "--serial", "--out", "/sys/tilesim-out"]) == 2
    assert "cannot write in /sys" in capsys.readouterr().err
