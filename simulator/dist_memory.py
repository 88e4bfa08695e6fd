"""Memory of one GPU in a distributed step: weights, gradients, optimizer state, activations.

Per parameter (mixed precision, Megatron): 16-bit weights (2 B), fp32 main gradients (4 B;
2 B in fp16), fp32 master weights and two Adam moments (12 B); fp32 training: 4 + 4 + 8 B.
ZeRO-1 and the distributed optimizer divide the optimizer state by the dp x cp group, ZeRO-2
also the gradients, ZeRO-3 also the weights, plus the gathered working set: ZeRO-3 gathers
module by module (DeepSpeed, FSDP), so the stage's two largest modules are live in full (the one
computing and the one prefetched: two layers, or a layer and an embedding table the stage holds);
over a group of one rank nothing is sharded and nothing is gathered.

Activations per layer and micro-batch (Korthikanti et al. 2022, eq. 2 and section 4, in
2-byte units, scaled by the element size; ``s`` = seq/cp; of the ``24/t`` the MLP's 16 scale
with ffn/4h and are 24 for SwiGLU, and a MoE layer routing each token to ``k`` experts keeps
them ``k`` times: `memory.parallel_units`; a MoE layer also keeps its experts' input, the ``k``
routed copies of each token gathered whole on every TP rank, ``+ 2k`` not divided by ``t``:
`memory.routed_units`):
no recompute ``s*b*h*(10 + 24/t + 5as/(ht))`` (``34/t`` with sequence parallelism; the
``5as/h`` score term vanishes with flash attention, `SimInputs.attention`, and its ``s`` is the
whole sequence under cp: a rank's queries meet every key over the ring),
selective recompute drops the score term, full recompute keeps only the layer input
``2*s*b*h`` (``/t`` with SP) plus one layer's full set while it is recomputed. The number of
micro-batches in flight comes from the stage's schedule (`schedules.in_flight`). The last
stage also holds the loss's fp32 softmax (``4*s*b*v/t``) of each micro-batch in flight through
its last chunk: one under 1F1B, all ``m`` under GPipe. A fixed reserve covers the CUDA context
and workspaces.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from forecast.kernels import ITEMSIZE_BYTES
from simulator.memory import (
    grad_itemsize_bytes,
    parallel_units,
    param_itemsize_bytes,
    routed_units,
)
from simulator.parallel import Layout
from simulator.scenario import SimInputs
from simulator.stagecost import chunk_expert_params, end_tensors, moe_layer_params

RESERVED_BYTES = 2**30  # CUDA context, cuBLAS/NCCL workspaces (about 1 GiB)


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
    run, m = layout.run, inputs.model
    s, b, h, t = inputs.seq_len // run.cp, run.micro_batch_size, m.hidden_size, run.tp
    par = parallel_units(m)  # attention's 8, the MLP's per expert of a token (MoE top-k)
    routed = routed_units(m, inputs.framework)  # the experts' input: whole on every TP rank
    # unfused scores: this rank's s = seq/cp queries against all seq keys (the cp ring steps'
    # blocks are all kept for the backward)
    scores = 0.0 if inputs.attention == "flash" else 5.0 * m.num_heads * inputs.seq_len / (h * t)
    sp = run.sequence_parallel
    recompute = "none" if working else run.recompute
    if recompute == "full":
        units = 2.0 / t if sp else 2.0
    else:
        units = ((10.0 + par) / t if sp else 10.0 + par / t) + routed
        units += scores if recompute == "none" else 0.0
    return s * b * h * units * ITEMSIZE_BYTES[inputs.dtype] / 2.0


def _gathered_params(inputs: SimInputs, layout: Layout, stage: int) -> float:
    """Parameters ZeRO-3 holds gathered at once on one GPU of ``stage``: its two largest modules
    (layers and the tables `end_tensors` lists); none when the dp x cp group is one rank."""
    m, run = inputs.model, layout.run
    if layout.dp * run.cp == 1:
        return 0.0
    dense = m.layer_params(moe=False) / run.tp
    expert = moe_layer_params(m, run)
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
    weights = params * param_itemsize_bytes(inputs.dtype)
    grads = params * grad_itemsize_bytes(inputs.dtype)
    optim = (sharded if run.shards_optimizer else params) * (12.0 if mixed else 8.0)
    chunks = layout.layers_per_stage[stage]
    if run.zero_stage >= 2:
        grads = sharded * grad_itemsize_bytes(inputs.dtype)
    other = float(RESERVED_BYTES)
    if run.zero_stage >= 3:
        gathered = _gathered_params(inputs, layout, stage)
        weights = (sharded + gathered) * param_itemsize_bytes(inputs.dtype)
    layers_per_chunk = sum(chunks) / len(chunks)
    acts = in_flight * layers_per_chunk * layer_activation_bytes(inputs, layout)
    if run.recompute == "full":
        other += layer_activation_bytes(inputs, layout, working=True)
    if stage == run.pp - 1:
        tokens = run.micro_batch_size * inputs.seq_len // run.cp
        # the loss saves its fp32 softmax for the backward: once per micro-batch in flight
        # through the last chunk (1F1B runs its backward next; GPipe holds all of them)
        heads = layout.num_micro_batches if run.schedule == "gpipe" else 1
        other += heads * 4.0 * tokens * inputs.model.vocab_size / run.tp
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
