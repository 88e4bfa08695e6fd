"""Memory of one GPU running a whole model: weights, gradients, optimizer state, activations.

Closed forms, per Korthikanti et al. 2022 (arXiv 2205.05198, eq. 2) scaled from 2-byte to the
workload's element size: one layer stores ``s*b*h*(34 + 5*a*s/h)`` bytes of activations in
16-bit (the ``5as/h`` attention-score term vanishes with flash attention, i.e. ``megatron``
with ``attention = "flash"``;
the MLP's 16 of the 34 scale with ffn / 4h, and are 24 for SwiGLU: `parallel_units`; a MoE
layer adds the copies of each token it routes to its experts: `routed_units`);
inference keeps two layers' worth alive. Adam keeps two fp32 moments per parameter, plus an
fp32 master copy when training in a 16-bit type.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from forecast.gpus import GPUSpec
from forecast.kernels import ITEMSIZE_BYTES, Dtype
from simulator.models import ModelSpec
from simulator.opgraph import Framework, Workload

GIB = 2**30


class MemoryEstimate(BaseModel):
    """Bytes per category and whether their sum fits in the GPU's memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    total_bytes: float
    hbm_bytes: float
    fits: bool


def parallel_units(model: ModelSpec) -> float:
    """The tensor-parallel part of eq. 2's per-token activations of one layer (24 at ffn = 4h,
    in 2-byte units of ``h``): attention's 8 (Q, K, V, the projection's input; with grouped-query
    attention K and V are ``kv_heads / num_heads`` as wide: 4 + 4 kv / heads) and the MLP's
    saved intermediates, ``2 * ffn / h`` each: GeLU's input and fc2's input (16 at ffn = 4h),
    SwiGLU's gate, up and fc2's input (24 at ffn = 4h). A MoE layer keeps that MLP part once
    per expert a token goes to (``experts_per_token``), averaged over the share of MoE layers."""
    q = model.num_heads * model.dhead / model.hidden_size  # Q and the projection's input
    kv = model.kv_heads * model.dhead / model.hidden_size  # K and V each
    attention = 2.0 * (2.0 * q + 2.0 * kv)
    saved = 3.0 if model.activation == "swiglu" else 2.0
    mlp = saved * 2.0 * model.ffn_hidden_size / model.hidden_size
    moe_share = model.moe_layers(model.num_layers) / model.num_layers
    return attention + mlp * (1.0 + (model.experts_per_token - 1) * moe_share)


def routed_units(model: ModelSpec, framework: Framework = "megatron") -> float:
    """The copies a MoE layer makes of each token it routes, in 2-byte units of ``h`` per token,
    averaged over the share of MoE layers (0 for a dense model): ``2k`` for the experts' input,
    each token's hidden state once per expert it goes to (``k = experts_per_token``), which
    the experts' first linear saves (Megatron-core's GroupedMLP / SequentialMLP; HF's
    ``hidden_states[top_x]``). Megatron-core's all-to-all token dispatcher all-gathers the
    routed tokens over TP (``gather_from_sequence_parallel_region``), so every TP rank keeps all
    ``k x tokens`` of them, ``h`` wide: this part is never divided by ``tp``, with or without
    sequence parallelism. HF eager adds another ``2k``: each expert's output times its routing
    weight, a multiply that saves the output for the weight's gradient. Megatron-core, since its
    memory-efficient token permutation (2025; Megatron-LM issue 1716), applies the routing
    probabilities inside the experts' activation, whose saved input serves, and unpermutes
    without them: nothing more. Before that its ``unpermute`` multiplied and saved ``k x
    tokens x h / tp`` more (TransformerEngine PR 1468 moved the multiply "to avoid saving huge
    input tensor of unpermute function")."""
    moe_share = model.moe_layers(model.num_layers) / model.num_layers
    copies = 2.0 if framework == "hf-eager" else 1.0
    return copies * 2.0 * model.experts_per_token * moe_share


def layer_activation_bytes(model: ModelSpec, run: Workload) -> float:
    """Activation bytes one layer keeps for its backward pass."""
    s, b, h, a = run.seq, run.batch, model.hidden_size, model.num_heads
    flash = run.framework == "megatron" and run.attention == "flash"
    scores = 0.0 if flash else 5.0 * a * s / h
    per_token = 10.0 + parallel_units(model) + routed_units(model, run.framework) + scores
    return s * b * h * per_token * ITEMSIZE_BYTES[run.dtype] / 2.0


def grad_itemsize_bytes(dtype: Dtype) -> int:
    """Bytes per gradient element in training (as reduced over DP): fp32 main gradients
    for fp32 and bf16, 16-bit for fp16 and fp8."""
    return 2 if dtype in (Dtype.FP16, Dtype.FP8) else 4


def param_itemsize_bytes(dtype: Dtype) -> int:
    """Bytes per model-weight element (fp8 training keeps 16-bit weights)."""
    return max(2, ITEMSIZE_BYTES[dtype])


def step_memory(
    *, num_params: float, item_bytes: float, train: bool, activations_bytes: float, gpu: GPUSpec
) -> MemoryEstimate:
    """Weights, and when training gradients plus Adam state (two fp32 moments, and an fp32
    master copy for 16-bit types), plus the given activations, against the GPU's memory.
    fp8 training keeps 16-bit weights and gradients (Transformer Engine casts to fp8 per GEMM;
    `param_itemsize_bytes`); fp8 inference holds 1-byte weights."""
    weights = num_params * (max(2.0, item_bytes) if train else item_bytes)
    if train:
        grads = weights
        master = 0.0 if item_bytes == 4 else 4.0 * num_params
        optim = 8.0 * num_params + master
    else:
        grads = optim = 0.0
    total = weights + grads + optim + activations_bytes
    return MemoryEstimate(
        weights_bytes=weights,
        gradients_bytes=grads,
        optimizer_bytes=optim,
        activations_bytes=activations_bytes,
        total_bytes=total,
        hbm_bytes=gpu.hbm_bytes,
        fits=total <= gpu.hbm_bytes,
    )


def estimate_memory(model: ModelSpec, run: Workload, gpu: GPUSpec) -> MemoryEstimate:
    """Weights, gradients, Adam state and activations of one training step or inference."""
    item = ITEMSIZE_BYTES[run.dtype]
    logits = float(run.logit_rows * model.vocab_size * item)
    train = run.mode == "train"
    if train:
        acts = model.total_layers * layer_activation_bytes(model, run) + 2.0 * logits
    else:
        acts = 2.0 * layer_activation_bytes(model, run) + logits
    n = float(model.num_params())
    return step_memory(num_params=n, item_bytes=item, train=train, activations_bytes=acts, gpu=gpu)
