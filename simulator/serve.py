"""Serving one model on one GPU: prefill a batch of prompts, then decode with a KV cache.

A request batch of ``batch`` prompts of ``prompt`` tokens runs one prefill pass (every
prompt token; it writes the KV cache and yields each sequence's first output token), then
``gen - 1`` decode passes, each one token per sequence attending over every token before it
(`opgraph.Workload` with ``kv_cache``: the inventories' attention over ``past + 1`` keys, the
cache append, the output head over each sequence's last token). Every pass's kernels are
forecast in one batched call (`forecast.stream.stream_table`) and summed per pass as
`e2e.predict_graph` sums a forward. Beyond `MAX_DECODE_SAMPLES` decode passes, that many
evenly spaced ones are forecast and the rest interpolated linearly between them (a pass's
time grows smoothly with its context; the steps of FlashAttention's 128-key blocks are
smaller than the spacing).

Static batching: the batch starts and ends together (no continuous batching, no paging,
no speculative decoding); one GPU (no tensor parallelism). Memory holds the weights, the KV
cache at its final length (``2 x layers x batch x kv_heads x head_dim x (prompt + gen)``
elements of the workload's dtype) and the prefill's activations; ``max_batch`` is the
largest batch that fits, as all three but the weights grow with the batch.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from forecast.gpus import GPUSpec
from forecast.kernels import ITEMSIZE_BYTES, Dtype
from forecast.predict import LatencyModel
from forecast.stream import stream_table
from simulator.e2e import FITTED, Overheads, family_times_s, phase_time_s
from simulator.errors import ConfigError
from simulator.memory import GIB, estimate_memory
from simulator.models import ModelSpec
from simulator.opgraph import Framework, OpGraph, Phase, Workload, build_ops, on_gpu


class ServeRequest(BaseModel):
    """A batch of generation requests on one GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: int = Field(gt=0, strict=True)
    prompt: int = Field(gt=0, strict=True)  # tokens per prompt
    gen: int = Field(gt=0, strict=True)  # tokens generated per sequence (the first by prefill)
    framework: Framework = "megatron"
    dtype: Dtype = Dtype.BF16


class ServeResult(BaseModel):
    """The forecast printed by ``tilesim serve``; times in ms."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefill_ms: float  # the prompt pass: time to the first token
    decode_ms: float  # the gen - 1 decode passes
    tpot_ms: float  # mean decode pass: time per output token after the first (0 at gen 1)
    first_decode_ms: float  # the decode pass at the shortest context (0 at gen 1)
    last_decode_ms: float  # the decode pass at the longest context (0 at gen 1)
    e2e_ms: float  # prefill + decode
    output_tokens_per_s: float  # batch x gen / e2e
    by_family_ms: dict[str, float]  # kernel time per op family over all passes
    weights_gib: float
    kv_cache_gib: float
    memory_gib: float
    fits: bool
    max_batch: int  # the largest batch that fits (0: the weights alone do not)


def kv_cache_bytes(model: ModelSpec, req: ServeRequest) -> float:
    """K and V of every layer for every token a sequence ends with, for the whole batch."""
    per_token = 2 * model.total_layers * model.kv_heads * model.dhead * ITEMSIZE_BYTES[req.dtype]
    return float(per_token * req.batch * (req.prompt + req.gen))


MAX_DECODE_SAMPLES = 256  # decode passes forecast one by one; beyond, interpolated


def decode_samples(gen: int) -> list[int]:
    """The decode passes (1 .. gen - 1) forecast: all of them up to `MAX_DECODE_SAMPLES`,
    else that many evenly spaced, the first and the last among them."""
    if gen - 1 <= MAX_DECODE_SAMPLES:
        return list(range(1, gen))
    return sorted({int(j) for j in np.rint(np.linspace(1, gen - 1, MAX_DECODE_SAMPLES))})


def passes(req: ServeRequest) -> list[Workload]:
    """The prefill pass, then the sampled decode passes (`decode_samples`)."""
    base = {
        "batch": req.batch,
        "mode": "inf",
        "framework": req.framework,
        "dtype": req.dtype,
        "kv_cache": True,
    }
    prefill = Workload.model_validate({**base, "seq": req.prompt})
    # decode pass j (1 .. gen - 1) feeds token prompt + j - 1 of each sequence
    decode = [
        Workload.model_validate({**base, "seq": 1, "past": req.prompt + j - 1})
        for j in decode_samples(req.gen)
    ]
    return [prefill, *decode]


def _memory(model: ModelSpec, gpu: GPUSpec, req: ServeRequest) -> tuple[float, float, float]:
    """Weights, KV cache and total bytes of ``req``."""
    prefill = Workload(
        batch=req.batch,
        seq=req.prompt,
        mode="inf",
        framework=req.framework,
        dtype=req.dtype,
        kv_cache=True,
    )
    mem = estimate_memory(model, prefill, gpu)
    kv = kv_cache_bytes(model, req)
    return mem.weights_bytes, kv, mem.total_bytes + kv


def max_batch(model: ModelSpec, gpu: GPUSpec, req: ServeRequest) -> int:
    """The largest batch whose weights, KV cache and prefill activations fit: all but the
    weights are linear in the batch, so it is a closed form of the batch-1 figures."""
    weights, _, total_one = _memory(model, gpu, req.model_copy(update={"batch": 1}))
    per_sequence = total_one - weights
    if weights > gpu.hbm_bytes:
        return 0
    return int((gpu.hbm_bytes - weights) // per_sequence)


def serve_forecast(
    model: ModelSpec,
    gpu: GPUSpec,
    req: ServeRequest,
    latency_model: LatencyModel,
    *,
    overheads: Overheads = FITTED,
) -> ServeResult:
    """Forecast prefill and every decode pass of ``req`` (module docstring)."""
    try:  # the last decode pass feeds position prompt + gen - 1
        model.check_sequence(req.prompt + req.gen - 1)
    except ConfigError as e:
        raise ConfigError(f"--prompt + --gen - 1 tokens: {e}") from None
    runs = [on_gpu(run, gpu) for run in passes(req)]
    graphs: list[OpGraph] = [build_ops(model, run) for run in runs]
    kernels = set().union(*(g.kernels() for g in graphs))
    table = stream_table(kernels, gpu, latency_model)
    times = [phase_time_s(g, table, Phase.FORWARD, overheads) for g in graphs]
    fams = [family_times_s(g, table, overheads) for g in graphs]
    sampled = np.array(decode_samples(req.gen), dtype=np.float64)
    every = np.arange(1, req.gen, dtype=np.float64)

    def all_passes(values: list[float]) -> float:
        """Sum over every decode pass, interpolated between the sampled ones."""
        return float(np.interp(every, sampled, values).sum()) if len(every) else 0.0

    families = {
        f: fams[0].get(f, 0.0) + all_passes([x.get(f, 0.0) for x in fams[1:]])
        for f in sorted(set().union(*fams))
    }
    prefill_s, steps = times[0], times[1:]
    decode_s = all_passes(steps)
    e2e_s = prefill_s + decode_s
    weights, kv, total = _memory(model, gpu, req)
    return ServeResult(
        prefill_ms=prefill_s * 1e3,
        decode_ms=decode_s * 1e3,
        tpot_ms=decode_s / (req.gen - 1) * 1e3 if steps else 0.0,
        first_decode_ms=steps[0] * 1e3 if steps else 0.0,
        last_decode_ms=steps[-1] * 1e3 if steps else 0.0,
        e2e_ms=e2e_s * 1e3,
        output_tokens_per_s=req.batch * req.gen / e2e_s,
        by_family_ms={k: v * 1e3 for k, v in families.items()},
        weights_gib=weights / GIB,
        kv_cache_gib=kv / GIB,
        memory_gib=total / GIB,
        fits=total <= gpu.hbm_bytes,
        max_batch=max_batch(model, gpu, req),
    )
