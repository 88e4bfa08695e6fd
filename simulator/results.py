"""What a simulated step reports: `StepResult`, `summarize` and the flat `to_row`.

FLOP convention (Narayanan et al. 2021, eq. 3): per token and layer the forward pass costs
``2 x`` (QKV, projection and FFN weights) ``+ 4 * s * h_attention`` (scores and values, causal
mask not discounted), the head ``2 * h * V``; a step is 3 forward passes. Model FLOPs give
MFU; hardware FLOPs add the recomputed forward (full: every layer; selective: the attention
scores), as Narayanan's published TFLOP/s count them.

That convention counts the scores and values over the whole ``S x S`` matrix, although a causal
decoder attends ``S (S + 1) / 2`` (query, key) pairs (`forecast.kernels.causal_pairs`, the
pairs its kernels run: context parallelism splits them over ranks, ``S (S + 1) / 2`` in all),
so at long sequences MFU passes 100%. ``mfu_causal`` counts those pairs only: the same model
FLOPs with ``4 * s * h_attention`` per token and layer replaced by ``2 * (s + 1) *
h_attention``; a bidirectional model's (BERT's encoder) equals ``mfu``. Model FLOPs whatever
the kernels: the fp32 stand-ins and unfused attention compute the whole matrix, then mask it.
``hfu_causal`` is ``hfu`` counted the same way: the recomputed forward's scores and values
(selective recompute's whole recomputation) over the unmasked pairs too.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

from forecast.kernels import causal_pairs
from simulator.dist_memory import MemoryBreakdown
from simulator.execgraph import Node
from simulator.models import ModelSpec
from simulator.parallel import Layout
from simulator.scheduler import Timeline, critical_path

OVER_100_REASON = (
    "they count every (query, key) pair, as published runs do; a causal model computes "
    "about half of them at long sequences (the causal figures)"
)
"""Why MFU, HFU or hardware TFLOP/s can pass 100% of peak: the one text `tilesim simulate`
and the sweep table print under such a figure."""

GIB = 2**30


@dataclass(frozen=True)
class StepResult:
    """One layout's predicted step (SI units; memory in GiB as the interface asks)."""

    iteration_s: float
    forward_backward_s: float
    optimizer_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    mfu_causal: float
    hfu: float
    hfu_causal: float
    tokens_per_s: float
    bubble_fraction: float
    exposed_comm_s: dict[str, float]
    memory_gib_per_gpu: float
    fits: bool
    reason: str
    num_micro_batches: int
    dp: int
    graph_nodes: int

    def to_row(self) -> dict[str, Any]:
        """A flat JSON-ready dict (``exposed_comm_s`` stays an object by kind)."""
        return asdict(self)


def forward_flops_per_token(model: ModelSpec, seq_len: int) -> tuple[float, float, float]:
    """(layer weights, layer attention, head) forward FLOPs per token, whole model."""
    h, qd, kvd = model.hidden_size, model.num_heads * model.dhead, model.kv_heads * model.dhead
    mats = 3 if model.activation == "swiglu" else 2
    ffn = mats * h * model.ffn_hidden_size
    moe = model.moe_layers(model.num_layers)
    per_layer = 2.0 * (h * (qd + 2 * kvd) + qd * h)
    weights = model.num_layers * per_layer + 2.0 * ffn * (
        (model.num_layers - moe) + moe * model.experts_per_token
    )
    attention = model.num_layers * 4.0 * seq_len * qd
    e = model.embed_width  # OPT's word_embed_proj_dim: the head is e wide, projected in and out
    return weights, attention, 2.0 * e * model.vocab_size + (4.0 * e * h if e != h else 0.0)


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What `summarize` needs besides the timeline."""

    model: ModelSpec
    layout: Layout
    seq_len: int
    global_batch_size: int
    num_gpus: int
    peak_flops_per_s: float
    memory: MemoryBreakdown


@dataclass(frozen=True, slots=True)
class StepFlops:
    """A step's FLOPs, whole model (module docstring): eq. 3's and the causal count, each
    without (model) and with (hardware) the recomputed forward."""

    model: float
    hardware: float
    causal_model: float
    causal_hardware: float


def _flops(info: StepInfo) -> StepFlops:
    m, s, how = info.model, info.seq_len, info.layout.run.recompute
    w, a, head = forward_flops_per_token(m, s)
    tokens = info.global_batch_size * s
    model = 3.0 * (w + a + head) * tokens
    recompute = {"none": 0.0, "selective": a, "full": w + a}[how]
    if not m.causal:
        return StepFlops(model, model + recompute * tokens, model, model + recompute * tokens)
    attention = causal_attention_flops(m, s) * info.global_batch_size
    causal = 3.0 * ((w + head) * tokens + attention)
    causal_recompute = {"none": 0.0, "selective": attention, "full": w * tokens + attention}[how]
    return StepFlops(model, model + recompute * tokens, causal, causal + causal_recompute)


def causal_attention_flops(model: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of one sequence's attention scores and values (QK^T, PV) over the (query,
    key) pairs a causal mask leaves, whole model: ``4 * h_attention`` per pair and layer, as
    `forward_flops_per_token` counts each of the ``s`` pairs of a token."""
    qd = model.num_heads * model.dhead
    return model.num_layers * 4.0 * qd * causal_pairs(seq_len, seq_len)


def _exposed(t: Timeline, path: list[Node]) -> dict[str, float]:
    out = {"tp": 0.0, "cp": 0.0, "ep": 0.0, "pp": 0.0, "dp": 0.0}
    nodes, edges = t.graph.nodes, t.graph.edges
    for n in path:
        a = nodes[n]
        if a["kind"] == "compute":
            parts = t.step.parts(n)
            for k in ("tp", "cp", "ep", "dp"):
                out[k] += parts[f"{k}_s"]
        elif a["kind"] == "comm":
            out[a["comm"]] += t.step.duration_s(n)
    for a, b in itertools.pairwise(path):
        if "comm" in edges[a, b]:
            out[edges[a, b]["comm"]] += t.step.delay_s(a, b)
    return out


def _phases(t: Timeline, path: list[Node] | None = None) -> tuple[float, float, float]:
    """(forward-backward end, optimizer time, mean idle fraction of compute streams). The
    optimizer's is the step's on the critical ``path`` (the stage whose update ends the step),
    so that compute, exposed communication and optimizer add up to the step; the slowest
    stage's was reported, which a stage that ends earlier can hold (Llama's last stage: the
    head and the final norm outweigh stage 0's embedding)."""
    end, dur = t.end, t.duration
    fb_end = [max(end[i] for i in idx) for idx in t.plan.compute]
    busy = [sum(dur[i] for i in idx) for idx in t.plan.compute]
    nodes = t.graph.nodes
    on_path = critical_path(t) if path is None else path
    opt = sum(t.step.duration_s(n) for n in on_path if nodes[n]["kind"] == "optimizer")
    span = max(fb_end)
    bubble = sum(1.0 - b / span for b in busy) / len(busy)
    return span, opt, bubble


def summarize(t: Timeline, info: StepInfo) -> StepResult:
    """Step time, breakdown, throughput and memory of one simulated layout."""
    iteration = t.makespan_s
    path = critical_path(t)
    fb, opt, bubble = _phases(t, path)
    flops = _flops(info)
    per_gpu = iteration * info.num_gpus
    peak = info.peak_flops_per_s
    return StepResult(
        iteration_s=iteration,
        forward_backward_s=fb,
        optimizer_s=opt,
        model_tflops_per_gpu=flops.model / per_gpu / 1e12,
        hardware_tflops_per_gpu=flops.hardware / per_gpu / 1e12,
        mfu=flops.model / per_gpu / peak,
        mfu_causal=flops.causal_model / per_gpu / peak,
        hfu=flops.hardware / per_gpu / peak,
        hfu_causal=flops.causal_hardware / per_gpu / peak,
        tokens_per_s=info.global_batch_size * info.seq_len / iteration,
        bubble_fraction=bubble,
        exposed_comm_s=_exposed(t, path),
        memory_gib_per_gpu=info.memory.total_bytes / GIB,
        fits=info.memory.fits,
        reason=info.memory.reason,
        num_micro_batches=info.layout.num_micro_batches,
        dp=info.layout.dp,
        graph_nodes=t.graph.number_of_nodes(),
    )
