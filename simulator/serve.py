"""Serving one model on one GPU: prefill a batch of prompts, then decode with a KV cache.

A request batch of ``batch`` prompts of ``prompt`` tokens runs one prefill pass (every
prompt token; it writes the KV cache and yields each sequence's first output token), then
``gen - 1`` decode passes, each one token per sequence attending over every token before it
(`opgraph.Workload` with ``kv_cache``: the inventories' attention over ``past + 1`` keys, the
cache append, the output head over each sequence's last token). Every pass's kernels are
forecast in one batched call (`forecast.stream.stream_table`) and summed per pass as
`e2e.predict_graph` sums a forward. Beyond `serve_request.MAX_DECODE_SAMPLES` decode
passes, that many
evenly spaced ones are forecast and the rest interpolated linearly between them (a pass's
time grows smoothly with its context; the steps of FlashAttention's 128-key blocks are
smaller than the spacing).

Host time is `e2e.FITTED`'s (none: the labelled runs are GPU-bound), so a small-batch
``hf-eager`` decode, which Python dispatch bounds, is forecast at its GPU time only.

Static batching: the batch starts and ends together (no continuous batching, no paging,
no speculative decoding). Memory holds the weights, the KV cache at its final length
(``2 x layers x batch x kv_heads x head_dim x (prompt + gen)`` elements of
`opgraph.Workload.kv_dtype`) and the prefill's activations; ``max_batch`` is the largest batch
that fits, as all three but the weights grow with the batch. fp8 means fp8 weights and GEMMs:
1-byte weights (under ``megatron`` those of the layers' linears only: the token table, output
head, norms and router run and stay in bf16, `memory.estimate_memory`), while under
``megatron`` attention runs in bf16 and reads a bf16 KV cache (as
TransformerEngine's recipe, and vLLM's fp8 weights without ``--kv-cache-dtype fp8``); under
``hf-eager`` every kernel runs in the dtype asked, attention and so its KV cache included (an
fp8 cache: a what-if, as eager PyTorch has no fp8 attention). The cache is sized for
``prompt + gen`` tokens, as a static cache is allocated (the last token generated is never
written: ``prompt + gen - 1`` are). MoE layers run only the experts their routed rows are
expected to reach under uniform routing (`moe_routing.routed_experts`: 2 of Mixtral's 8 at
batch 1, 4 at batch 2, 5 at batch 4).

Tensor parallelism (``tp`` GPUs of one server): each GPU holds ``1 / tp`` of the model
(`serve_parallel.shard`), so every figure above is per GPU, and each pass adds its blocking
collectives (`serve_parallel.tp_comm_s`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict

from forecast.gpus import GPUSpec
from forecast.kernels import ITEMSIZE_BYTES
from forecast.predict import LatencyModel
from forecast.stream import stream_table
from simulator.e2e import FITTED, Overheads, family_times_s, phase_time_s
from simulator.memory import GIB, estimate_memory, usable_bytes
from simulator.models import ModelSpec
from simulator.opgraph import OpGraph, Phase, build_ops, on_gpu
from simulator.serve_parallel import shard, tp_comm_s
from simulator.serve_request import (
    ServeRequest,
    check_request,
    decode_samples,
    passes,
    prefill_pass,
)
from topologies import Cluster


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
    comm_ms: float  # tensor-parallel collectives over all passes (0 at tp 1)
    weights_gib: float
    kv_cache_gib: float
    memory_gib: float  # weights + KV cache + the prefill's activations
    fits: bool
    max_batch: int  # the largest batch that fits (0: not even one sequence)
    activations_gib: float  # the prefill's live activations, the rest of memory_gib
    usable_gib: float  # GPU memory a forecast may fill (`usable_bytes`: less the reserve)


def kv_cache_bytes(model: ModelSpec, req: ServeRequest) -> float:
    """K and V of every layer for every token a sequence ends with, for the whole batch, in
    the dtype attention reads them in (`opgraph.Workload.kv_dtype`: bf16 for megatron fp8)."""
    item = ITEMSIZE_BYTES[prefill_pass(req).kv_dtype]
    per_token = 2 * model.total_layers * model.kv_heads * model.dhead * item
    return float(per_token * req.batch * (req.prompt + req.gen))


@dataclass(frozen=True, slots=True)
class ServeMemory:
    """Bytes one GPU holds for a request: weights, KV cache and the prefill's activations."""

    weights_bytes: float
    kv_cache_bytes: float
    activations_bytes: float  # the prefill's: `memory.estimate_memory` of an inference pass

    @property
    def total_bytes(self) -> float:
        """The three parts summed (the weights and activations first, as `estimate_memory`
        sums an inference pass's total, then the KV cache)."""
        return self.weights_bytes + self.activations_bytes + self.kv_cache_bytes


def _memory(model: ModelSpec, gpu: GPUSpec, req: ServeRequest) -> ServeMemory:
    """Weights, KV cache and activation bytes of ``req``: the prefill's activations as
    it runs on ``gpu`` (`on_gpu`: unfused attention, its scores in memory, where
    FlashAttention-2 has no kernels), as `e2e.predict_run` and ``tilesim predict --mode inf``
    count them (two layers' worth alive, and the last tokens' logits)."""
    mem = estimate_memory(model, on_gpu(prefill_pass(req), gpu), gpu)
    kv = kv_cache_bytes(model, req)
    return ServeMemory(mem.weights_bytes, kv, mem.activations_bytes)


def max_batch(model: ModelSpec, gpu: GPUSpec, req: ServeRequest) -> int:
    """The largest batch whose weights, KV cache and prefill activations fit: all but the
    weights are linear in the batch, so it is a closed form of the batch-1 figures."""
    one = _memory(model, gpu, req.model_copy(update={"batch": 1}))
    weights = one.weights_bytes
    per_sequence = one.total_bytes - weights
    if weights > usable_bytes(gpu):
        return 0
    return int((usable_bytes(gpu) - weights) // per_sequence)


@dataclass(frozen=True)
class PassTimes:
    """Forecast seconds of the prefill pass and the sampled decode passes (`decode_samples`),
    tensor-parallel collectives included, with each pass's kernel time per op family."""

    request: ServeRequest
    local: ModelSpec  # the part of the model one GPU holds
    decode_passes: list[int]  # the sampled decode passes, 1 .. gen - 1
    seconds: list[float]  # prefill, then the sampled decode passes
    comm_s: list[float]
    families_s: list[dict[str, float]]

    @property
    def contexts(self) -> list[int]:
        """Keys the last query of each pass attends to: the prompt, then prompt + j."""
        return [self.request.prompt] + [self.request.prompt + j for j in self.decode_passes]

    def all_decode(self, values: list[float]) -> float:
        """Sum over every decode pass, linearly interpolated between the sampled ones, in
        closed form (no array of ``gen - 1`` passes): each segment ``a .. b`` of the sampled
        passes adds its whole-number passes ``a .. b - 1``, ``(b - a) (v_a + v_b) / 2 -
        (v_b - v_a) / 2``, and the last sampled pass adds its own value."""
        if not self.decode_passes:
            return 0.0
        x, v = np.array(self.decode_passes, np.float64), np.array(values, np.float64)
        n, lo, hi = np.diff(x), v[:-1], v[1:]
        return float((n * (lo + hi) / 2 - (hi - lo) / 2).sum() + v[-1])


def forecast_passes(
    model: ModelSpec,
    gpu: GPUSpec,
    req: ServeRequest,
    latency_model: LatencyModel,
    *,
    cluster: Cluster | None = None,
    overheads: Overheads = FITTED,
) -> PassTimes:
    """Forecast the prefill and the sampled decode passes of ``req`` in one batched kernel
    forecast; ``req.tp > 1`` needs the ``cluster`` of one server its GPUs sit in."""
    check_request(model, req, cluster)
    local = shard(model, req.tp)
    runs = [on_gpu(run, gpu) for run in passes(req)]
    graphs: list[OpGraph] = [build_ops(local, run) for run in runs]
    kernels = set().union(*(g.kernels() for g in graphs))
    table = stream_table(kernels, gpu, latency_model)
    comm = [tp_comm_s(model, run, req.tp, cluster) for run in runs]
    seconds = [
        phase_time_s(g, table, Phase.FORWARD, overheads) + c
        for g, c in zip(graphs, comm, strict=True)
    ]
    families = [family_times_s(g, table, overheads) for g in graphs]
    return PassTimes(req, local, decode_samples(req.gen), seconds, comm, families)


def serve_forecast(
    model: ModelSpec,
    gpu: GPUSpec,
    req: ServeRequest,
    latency_model: LatencyModel,
    *,
    cluster: Cluster | None = None,
    overheads: Overheads = FITTED,
) -> ServeResult:
    """Forecast prefill and every decode pass of ``req`` (module docstring); ``req.tp > 1``
    needs the ``cluster`` of one server its GPUs sit in."""
    p = forecast_passes(model, gpu, req, latency_model, cluster=cluster, overheads=overheads)
    return summarise(p, gpu)


def summarise(p: PassTimes, gpu: GPUSpec) -> ServeResult:
    """The result printed for the passes ``p`` forecast on ``gpu``."""
    req = p.request
    fams = p.families_s
    families = {
        f: fams[0].get(f, 0.0) + p.all_decode([x.get(f, 0.0) for x in fams[1:]])
        for f in sorted(set().union(*fams))
    }
    prefill_s, steps = p.seconds[0], p.seconds[1:]
    decode_s = p.all_decode(steps)
    e2e_s = prefill_s + decode_s
    mem = _memory(p.local, gpu, req)
    total = mem.total_bytes
    return ServeResult(
        prefill_ms=prefill_s * 1e3,
        decode_ms=decode_s * 1e3,
        tpot_ms=decode_s / (req.gen - 1) * 1e3 if steps else 0.0,
        first_decode_ms=steps[0] * 1e3 if steps else 0.0,
        last_decode_ms=steps[-1] * 1e3 if steps else 0.0,
        e2e_ms=e2e_s * 1e3,
        output_tokens_per_s=req.batch * req.gen / e2e_s,
        by_family_ms={k: v * 1e3 for k, v in families.items()},
        comm_ms=(p.comm_s[0] + p.all_decode(p.comm_s[1:])) * 1e3,
        weights_gib=mem.weights_bytes / GIB,
        kv_cache_gib=mem.kv_cache_bytes / GIB,
        activations_gib=mem.activations_bytes / GIB,
        memory_gib=total / GIB,
        fits=total <= usable_bytes(gpu),
        max_batch=max_batch(p.local, gpu, req),
        usable_gib=usable_bytes(gpu) / GIB,
    )
