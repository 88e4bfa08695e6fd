"""Memory of one GPU in a distributed step: weights, gradients, optimizer state, activations.

Per parameter (mixed precision, Megatron): 16-bit weights (2 B), fp32 main gradients (4 B;
2 B in fp16), fp32 master weights and two Adam moments (12 B); fp32 training: 4 + 4 + 8 B;
fp8 training is bf16's plus TransformerEngine's cached fp8 copy of each GEMM weight and of its
transpose (2 B per GEMM weight element, `_fp8_weight_cache_bytes`). A GPU of a TP group holds
``1/tp`` of the column- and row-parallel weights and the column-parallel biases, and the norms
and row-parallel biases whole (`shard_params.dense_layer_params`).
ZeRO-1 and the distributed optimizer divide the optimizer state by the dp x cp group, ZeRO-2
also the gradients, ZeRO-3 also the weights, plus the gathered working set: ZeRO-3 gathers
module by module (DeepSpeed, FSDP), so the stage's two largest modules are live in full (the one
computing and the one prefetched: two layers, or a layer and an embedding table the stage holds);
over a group of one rank nothing is sharded and nothing is gathered. Expert parameters (MoE)
shard, and gather, over the ranks holding the same experts instead, dp x cp / ep
(`Layout.edp_group`: ep is carved out of dp x cp and each expert split over tp, so
Megatron-core's expert data-parallel size dp cp tp / (ep etp) with etp = tp).

Activations per layer and micro-batch (Korthikanti et al. 2022, eq. 2 and section 4, in
2-byte units, scaled by the element size; ``s`` = seq/cp; of the ``24/t`` the MLP's 16 scale
with ffn/4h and are 24 for SwiGLU, and a MoE layer routing each token to ``k`` experts keeps
them ``k`` times: `memory.parallel_units`; a MoE layer also keeps its experts' input, the ``k``
routed copies of each token gathered whole on every TP rank, ``+ 2k`` not divided by ``t``:
`memory.saved_bytes`; both for the copies a binding expert capacity keeps, the share the
dispatcher moves: `comm.routed_share`):
no recompute ``s*b*h*(10 + 24/t + 5as/(ht))`` (``34/t`` with sequence parallelism; the
``5as/h`` score term vanishes with flash attention, `SimInputs.attention`, which context
parallelism requires: `context_parallel.check_attention`),
selective recompute drops the score term, full recompute keeps only the layer input
``2*s*b*h`` (``/t`` with SP) plus one layer's full set while it is recomputed. Those are
16-bit bytes; fp8 training (TransformerEngine) keeps everything in bf16 but for the fp8 copies
the GEMMs save of their inputs: ``8 + 21/t`` for a GPT layer with flash attention
(`memory.saved_bytes`). The number of
micro-batches in flight comes from the stage's schedule (`schedules.in_flight`). The last
stage also holds the loss's fp32 softmax (``4*s*b*v/t``) of each micro-batch in flight through
its last chunk: one under 1F1B, all ``m`` under GPipe. Under ``cp_comm_type = "all_gather"``
one layer's attention core holds whole-sequence K,V-sized temporaries while it runs, the gathered
K and V and, in backward, the whole-sequence dK and dV (`context_parallel.gathered_kv_units`).
A reserve covers the CUDA context and workspaces (``training.memory_reserved_gib``, 1 GiB
unless raised for allocator fragmentation).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from forecast.kernels import ITEMSIZE_BYTES
from simulator.comm import routed_share
from simulator.context_parallel import gathered_kv_units
from simulator.memory import (
    FP8_WEIGHT_CACHE_BYTES_PER_ELEMENT,
    activation_itemsize_bytes,
    grad_itemsize_bytes,
    param_itemsize_bytes,
    saved_bytes,
    score_bytes,
)
from simulator.opgraph import te_fp8
from simulator.parallel import Layout
from simulator.scenario import SimInputs
from simulator.shard_params import (
    chunk_expert_params,
    chunk_gemm_weights,
    dense_layer_params,
    end_tensors,
    expert_layer_params,
    moe_layer_params,
)


class MemoryBreakdown(BaseModel):
    """Bytes on the fullest GPU, by category; ``reason`` explains a misfit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stage: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    total_bytes: float
    hbm_bytes: float
    fits: bool
    reason: str = ""


def layer_activation_bytes(inputs: SimInputs, layout: Layout, *, working: bool = False) -> float:
    """Bytes one layer keeps per micro-batch (``working``: as if not recomputed)."""
    run, m, dt, fw = layout.run, inputs.model, inputs.dtype, inputs.framework
    s, b, h, t = inputs.seq_len // run.cp, run.micro_batch_size, m.hidden_size, run.tp
    flash = inputs.attention == "flash"
    # replicated (norms' inputs, masks, QKV/fc1 inputs), split over TP (attention's, the MLP's
    # per expert of a token), routed (the experts' input: whole on every TP rank), in bytes
    # the experts keep the rows their dispatcher moves (a binding capacity drops the rest)
    kept = routed_share(inputs, layout) if m.num_experts > 1 else 1.0
    saved = saved_bytes(m, fw, dt, flash=flash, kept=kept)
    # unfused scores (cp 1 only: `context_parallel.check_attention`)
    scores = 0.0 if flash else score_bytes(m, inputs.seq_len, dt, fw) / t
    sp = run.sequence_parallel
    recompute = "none" if working else run.recompute
    if recompute == "full":  # the layer's input: the residual stream (bf16 under fp8)
        per_token = activation_itemsize_bytes(dt, fw) / (t if sp else 1)
    else:
        rep, par = saved.replicated, saved.parallel
        per_token = ((rep + par) / t if sp else rep + par / t) + saved.routed
        per_token += scores if recompute == "none" else 0.0
    return s * b * h * per_token


def _gathered_params(inputs: SimInputs, layout: Layout, stage: int) -> float:
    """Parameters ZeRO-3 holds gathered at once on one GPU of ``stage``: its two largest modules
    (layers and the tables `end_tensors` lists); none when the dp x cp group is one rank. A MoE
    layer's experts are sharded over their expert-data-parallel group (`Layout.edp_group`, dp x
    cp / ep): when that is one rank (ep = dp x cp) they are held whole and not gathered."""
    m, run = inputs.model, layout.run
    if layout.dp * run.cp == 1:
        return 0.0
    dense = dense_layer_params(m, run)
    experts_whole = len(layout.edp_group) == 1
    expert = moe_layer_params(m, run) - (expert_layer_params(m, run) if experts_whole else 0.0)
    chunks = layout.layers_per_stage[stage]
    units: list[float] = []
    for c, layers in enumerate(chunks):
        moe = m.moe_layers(layers)
        vs = c * run.pp + stage
        ends = end_tensors(m, run, first=vs == 0, last=vs == run.pp * len(chunks) - 1)
        units += [dense] * (layers - moe) + [expert] * moe + ends
    return sum(sorted(units)[-2:])


def _expert_params(inputs: SimInputs, layout: Layout, stage: int) -> float:
    """Expert parameters one GPU of ``stage`` holds (its ``num_experts / ep`` experts' share)."""
    m, run = inputs.model, layout.run
    return sum(chunk_expert_params(m, run, n) for n in layout.layers_per_stage[stage])


def _fp8_weight_cache_bytes(inputs: SimInputs, layout: Layout, stage: int) -> float:
    """TransformerEngine's fp8 copies of the GEMM weights one GPU of ``stage`` holds: each TE
    linear casts its weight to fp8 and, for the backward's input-gradient GEMM (Hopper's fp8
    GEMMs take TN layouts only), its transpose, 1 + 1 bytes an element, and caches both across
    micro-batches (Megatron-core's TE wrappers pass ``is_first_microbatch`` unless
    ``disable_parameter_transpose_cache``; TE's ``get_weight_workspace`` keeps them in
    ``_fp8_workspaces``); under ZeRO-3 (FSDP) TE shards the cached copies as the weights."""
    run = layout.run
    parts = [chunk_gemm_weights(inputs.model, run, n) for n in layout.layers_per_stage[stage]]
    gemm, expert = sum(p for p, _ in parts), sum(e for _, e in parts)
    held = layout.sharded(gemm, expert) if run.zero_stage >= 3 else gemm
    return FP8_WEIGHT_CACHE_BYTES_PER_ELEMENT * held


def stage_memory(
    inputs: SimInputs, layout: Layout, stage: int, params: float, in_flight: int
) -> MemoryBreakdown:
    """Bytes on one GPU of ``stage`` holding ``params`` parameters.

    ZeRO shards a dense parameter's state over the dp x cp group and an expert's over the
    ranks that hold that expert, dp x cp / ep (expert parallelism is carved out of dp x cp)."""
    run = layout.run
    expert = _expert_params(inputs, layout, stage)
    sharded = layout.sharded(params, expert)  # one rank's share
    mixed = ITEMSIZE_BYTES[inputs.dtype] < 4
    weights = _weight_bytes(inputs, layout, stage, params=params, sharded=sharded)
    grads = (sharded if run.zero_stage >= 2 else params) * grad_itemsize_bytes(inputs.dtype)
    optim = (sharded if run.shards_optimizer else params) * (12.0 if mixed else 8.0)
    chunks = layout.layers_per_stage[stage]
    layers_per_chunk = sum(chunks) / len(chunks)
    acts = in_flight * layers_per_chunk * layer_activation_bytes(inputs, layout)
    other = _other_bytes(inputs, layout, stage)
    total = weights + grads + optim + acts + other
    hbm = inputs.gpu.hbm_bytes
    fits = total <= hbm
    reason = "" if fits else f"stage {stage} needs {total / 2**30:.1f} GiB > {hbm / 2**30:.1f} GiB"
    return MemoryBreakdown(
        stage=stage,
        weights_bytes=weights,
        gradients_bytes=grads,
        optimizer_bytes=optim,
        activations_bytes=acts,
        other_bytes=other,
        total_bytes=total,
        hbm_bytes=hbm,
        fits=fits,
        reason=reason,
    )


def _weight_bytes(
    inputs: SimInputs, layout: Layout, stage: int, *, params: float, sharded: float
) -> float:
    """Weight bytes on one GPU of ``stage``: its ``params`` parameters, or under ZeRO-3 its
    ``sharded`` share plus the gathered working set (`_gathered_params`); TransformerEngine's
    cached fp8 copies on top under fp8 training (`_fp8_weight_cache_bytes`)."""
    weights = params * param_itemsize_bytes(inputs.dtype)
    if layout.run.zero_stage >= 3:
        gathered = _gathered_params(inputs, layout, stage)
        weights = (sharded + gathered) * param_itemsize_bytes(inputs.dtype)
    if te_fp8(inputs.dtype, inputs.framework):
        weights += _fp8_weight_cache_bytes(inputs, layout, stage)
    return weights


def _other_bytes(inputs: SimInputs, layout: Layout, stage: int) -> float:
    """Bytes on one GPU of ``stage`` besides the model state and the activations in flight:
    the reserve (``training.memory_reserved_gib``), one layer's full set while it is
    recomputed (full recompute), the K,V all-gather's temporaries (`cp_gather_bytes`), and on
    the last stage the loss's fp32 softmax."""
    run = layout.run
    other = float(inputs.reserved_bytes) + cp_gather_bytes(inputs, layout)
    if run.recompute == "full":
        other += layer_activation_bytes(inputs, layout, working=True)
    if stage == run.pp - 1:
        tokens = run.micro_batch_size * inputs.seq_len // run.cp
        # the loss saves its fp32 softmax for the backward: once per micro-batch in flight
        # through the last chunk (1F1B runs its backward next; GPipe holds all of them)
        heads = layout.num_micro_batches if run.schedule == "gpipe" else 1
        other += heads * 4.0 * tokens * inputs.model.vocab_size / run.tp
    return other


def cp_gather_bytes(inputs: SimInputs, layout: Layout) -> float:
    """Peak bytes of one layer's whole-sequence K,V temporaries under ``cp_comm_type =
    "all_gather"`` (`context_parallel.gathered_kv_units` of the whole sequence's K and V on one
    TP rank, ``2 b S kv_heads dhead / tp`` elements, bf16 under fp8 as `comm` moves them);
    0.0 for the other types and at cp 1. One layer's core runs at a time: counted once."""
    run, m = layout.run, inputs.model
    units = gathered_kv_units(run.cp_comm_type, run.cp, causal=m.causal)
    if units == 0.0:
        return 0.0
    kv = 2 * run.micro_batch_size * inputs.seq_len * m.kv_heads * m.dhead / run.tp
    return units * kv * activation_itemsize_bytes(inputs.dtype, inputs.framework)
