"""Memory of one GPU running a whole model: weights, gradients, optimizer state, activations.

Closed forms, per Korthikanti et al. 2022 (arXiv 2205.05198, eq. 2) scaled from 2-byte to the
workload's element size: one layer stores ``s*b*h*(34 + 5*a*s/h)`` bytes of activations in
16-bit (the ``5as/h`` attention-score term vanishes with flash attention, i.e. ``megatron``);
inference keeps two layers' worth alive. Adam keeps two fp32 moments per parameter, plus an
fp32 master copy when training in a 16-bit type.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from forecast.gpus import GPUSpec
from forecast.kernels import ITEMSIZE_BYTES
from simulator.models import ModelSpec
from simulator.opgraph import Workload

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


def layer_activation_bytes(model: ModelSpec, run: Workload) -> float:
    """Activation bytes one layer keeps for its backward pass."""
    s, b, h, a = run.seq, run.batch, model.hidden_size, model.num_heads
    scores = 0.0 if run.framework == "megatron" else 5.0 * a * s / h
    ffn_scale = model.ffn_hidden_size / (4.0 * h)  # eq. 2 assumes ffn = 4h
    per_token = 10.0 + 24.0 * ffn_scale + scores
    return s * b * h * per_token * ITEMSIZE_BYTES[run.dtype] / 2.0


def estimate_memory(model: ModelSpec, run: Workload, gpu: GPUSpec) -> MemoryEstimate:
    """Weights, gradients, Adam state and activations of one training step or inference."""
    n = float(model.num_params())
    item = ITEMSIZE_BYTES[run.dtype]
    logits = float(run.tokens * model.vocab_size * item)
    weights = n * item
    if run.mode == "train":
        grads = n * item
        master = 0.0 if item == 4 else 4.0 * n
        optim = 8.0 * n + master
        acts = model.total_layers * layer_activation_bytes(model, run) + 2.0 * logits
    else:
        grads = optim = 0.0
        acts = 2.0 * layer_activation_bytes(model, run) + logits
    total = weights + grads + optim + acts
    return MemoryEstimate(
        weights_bytes=weights,
        gradients_bytes=grads,
        optimizer_bytes=optim,
        activations_bytes=acts,
        total_bytes=total,
        hbm_bytes=gpu.hbm_bytes,
        fits=total <= gpu.hbm_bytes,
    )
