"""Memory of one GPU running a whole model: weights, gradients, optimizer state, activations.

Closed forms, per Korthikanti et al. 2022 (arXiv 2205.05198, eq. 2) scaled from 2-byte to the
workload's element size: one layer stores ``s*b*h*(34 + 5*a*s/h)`` bytes of activations in
16-bit (the ``5as/h`` attention-score term vanishes with flash attention, i.e. ``megatron``
with ``attention = "flash"``;
the MLP's 16 of the 34 scale with ffn / 4h, and are 24 for SwiGLU: `parallel_units`; a MoE
layer adds the copies of each token it routes to its experts: `saved_bytes`); fp8 training
under Megatron-LM (TransformerEngine) keeps bf16 activations but for the fp8 copies of the
GEMMs' inputs (`saved_bytes`), and holds an fp8 copy of each GEMM weight and of its
transpose (`gemm_weights`); inference keeps two layers' worth alive, and in fp8 holds 1-byte
GEMM weights beside bf16 tables, head and norms. Adam keeps two fp32
moments per parameter, plus an fp32 master copy when training in a 16-bit type.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from forecast.gpus import GPUSpec
from forecast.kernels import ITEMSIZE_BYTES, Dtype
from simulator.models import ModelSpec
from simulator.moe_routing import routed_share
from simulator.opgraph import Framework, Workload, te_fp8

GIB = 2**30
# a dropout mask: torch's native_dropout (and Megatron's fused bias-dropout-add) saves bool
MASK_ITEMSIZE_BYTES = 1


# CUDA context, cuBLAS/NCCL workspaces (about 1 GiB): counted in a distributed stage's
# memory (`dist_memory`), and kept free of a single GPU's estimate here and in `serve`
RESERVED_BYTES = 2**30


def usable_bytes(gpu: GPUSpec) -> float:
    """What a program's tensors can take of ``gpu``'s memory: all but `RESERVED_BYTES`."""
    return gpu.hbm_bytes - RESERVED_BYTES


class MemoryEstimate(BaseModel):
    """Bytes per category and whether their sum fits in the GPU's memory (`usable_bytes`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    total_bytes: float
    hbm_bytes: float
    fits: bool


def activation_itemsize_bytes(dtype: Dtype, framework: Framework = "megatron") -> int:
    """Bytes per element of the hidden states, attention and activation-function tensors:
    bf16 under TransformerEngine's fp8 (it casts each GEMM's input to fp8 inside the GEMM's
    module and returns bf16 outputs; its DotProductAttention runs in bf16 by default), else
    the workload's element size (HF eager runs every op in it)."""
    return 2 if te_fp8(dtype, framework) else ITEMSIZE_BYTES[dtype]


@dataclass(frozen=True, slots=True)
class SavedBytes:
    """Bytes one layer keeps for its backward per token and hidden element (``s*b*h``):
    ``replicated`` on every TP rank (``/ t`` with sequence parallelism), ``parallel`` split
    over TP, ``routed`` (MoE experts' input) whole on every TP rank; the unfused attention's
    scores come on top (`score_bytes`)."""

    replicated: float
    parallel: float
    routed: float


def saved_bytes(
    model: ModelSpec, framework: Framework, dtype: Dtype, *, flash: bool = True, kept: float = 1.0
) -> SavedBytes:
    """Korthikanti et al. 2022, eq. 2, tensor by tensor, with ``x`` = the activations' element
    size (`activation_itemsize_bytes`) and ``g`` = the element size a GEMM saves its input in
    for its weight gradient (1 under TransformerEngine's fp8: ``_Linear`` / ``_LayerNormLinear``
    save the fp8 cast of their input, transformer_engine/pytorch/module/linear.py and
    layernorm_linear.py; else ``x``, the one tensor serving both):

    * replicated: the two norms' inputs ``2x``, two bool dropout masks (1 byte each, whatever
      the dtype), the QKV and fc1 inputs ``2g``: 10 in 16-bit, 8 under fp8, 18 in fp32;
    * parallel: the attention's and the MLP's tensors (`_parallel_saved_bytes`);
    * routed: the experts' first GEMM input, ``g`` per routed copy (``k = experts_per_token``
      copies of each token; Megatron-core's GroupedMLP / SequentialMLP, HF's
      ``hidden_states[top_x]``), whole on every TP rank, as the all-to-all dispatcher gathers
      the routed tokens over TP (``gather_from_sequence_parallel_region``); HF eager adds ``x``
      more, each expert's output times its routing weight. Megatron-core since its
      memory-efficient token permutation (2025; Megatron-LM issue 1716) applies the routing
      probabilities inside the experts' activation and unpermutes without them: nothing more
      (before, its ``unpermute`` saved ``k x tokens x h / tp``; TransformerEngine PR 1468).

    ``kept``: the share of the ``k`` routed copies the experts run, below 1 when an expert
    capacity drops rows (`moe_routing.routed_share`, the share the dispatcher moves): the routed
    input and the experts' MLP tensors scale with it.
    """
    x = activation_itemsize_bytes(dtype, framework)
    g = ITEMSIZE_BYTES[dtype]
    parallel = _parallel_saved_bytes(model, framework, dtype, flash=flash, kept=kept)
    copies = g + (x if framework == "hf-eager" else 0.0)
    routed = copies * model.experts_per_token * kept * _moe_share(model)
    masks = 2.0 * MASK_ITEMSIZE_BYTES  # attention's output and the MLP's output dropout
    return SavedBytes(replicated=2.0 * x + masks + 2.0 * g, parallel=parallel, routed=routed)


def _parallel_saved_bytes(
    model: ModelSpec, framework: Framework, dtype: Dtype, *, flash: bool, kept: float = 1.0
) -> float:
    """`SavedBytes.parallel` (``x``, ``g``: `saved_bytes`): Q ``xq``, K and V ``2x kv`` (``q``,
    ``kv``: their widths over ``h``), the projection's input ``gq``, plus FlashAttention's own
    bf16 output ``xq`` where the projection keeps a separate fp8 copy; the MLP's
    activation-function tensors, ``x f/h`` each: GeLU's input (1), Megatron's fused SwiGLU's
    gate and up (2; it recomputes SiLU in backward), HF eager ``LlamaMLP``'s gate, SiLU(gate)
    and up (3: SiLU saves its input, the multiply both of its inputs); and fc2's input
    ``g f/h``; a MoE layer keeps that MLP part once per expert a token goes to and the
    experts keep (``k x kept``: `saved_bytes`), averaged over the share of MoE layers."""
    x = activation_itemsize_bytes(dtype, framework)
    g = ITEMSIZE_BYTES[dtype]
    q = model.num_heads * model.dhead / model.hidden_size
    kv = model.kv_heads * model.dhead / model.hidden_size
    flash_out = x * q if flash and g != x else 0.0  # FlashAttention's saved bf16 output
    attention = x * q + 2.0 * x * kv + g * q + flash_out
    swiglu = 3.0 if framework == "hf-eager" else 2.0
    act = swiglu if model.activation == "swiglu" else 1.0
    mlp = (act * x + g) * model.ffn_hidden_size / model.hidden_size
    copies = model.experts_per_token * kept  # a MoE layer's MLP part, per token
    return attention + mlp * (1.0 + (copies - 1.0) * _moe_share(model))


def _moe_share(model: ModelSpec) -> float:
    """The share of the model's layers that carry experts."""
    return model.moe_layers(model.num_layers) / model.num_layers


# TransformerEngine's fp8 copy of each GEMM weight and of its transpose, cached across
# micro-batches (`dist_memory._fp8_weight_cache_bytes`): 1 + 1 bytes a weight element
FP8_WEIGHT_CACHE_BYTES_PER_ELEMENT = 2


def gemm_weights(model: ModelSpec, layers: int, *, tp: int = 1, ep: int = 1) -> tuple[float, float]:
    """Elements of the GEMM weights (QKV, projection, the MLP's; not the router, norms, biases
    or the tables) one GPU holds of ``layers`` layers over ``tp`` (experts also over ``ep``),
    and how many of them are expert weights: what TransformerEngine casts to fp8."""
    h, qd, kvd = model.hidden_size, model.num_heads * model.dhead, model.kv_heads * model.dhead
    mats = 3 if model.activation == "swiglu" else 2
    attention = (h * (qd + 2 * kvd) + qd * h) / tp
    mlp = mats * h * model.ffn_hidden_size / tp
    moe = model.moe_layers(layers)
    expert = moe * mlp * model.num_experts / ep
    return layers * attention + (layers - moe) * mlp + expert, expert


def score_bytes(model: ModelSpec, seq: int, dtype: Dtype, framework: Framework) -> float:
    """Unfused attention's scores per token and hidden element: softmax output and dropout
    output in the activations' element size (bf16 under TransformerEngine's fp8), and the
    1-byte dropout mask, ``5as/h`` in 16-bit, ``9as/h`` in fp32 (``seq``: the keys a query
    meets)."""
    x = activation_itemsize_bytes(dtype, framework)
    return (2.0 * x + MASK_ITEMSIZE_BYTES) * model.num_heads * seq / model.hidden_size


def parallel_units(model: ModelSpec, framework: Framework = "megatron") -> float:
    """The tensor-parallel part of eq. 2's per-token activations of one layer in 2-byte units
    of ``h`` (24 at ffn = 4h): `saved_bytes`'s ``parallel`` in bf16."""
    return saved_bytes(model, framework, Dtype.BF16).parallel


def layer_activation_bytes(model: ModelSpec, run: Workload) -> float:
    """Activation bytes one layer keeps for its backward pass (a MoE layer's experts: the
    routed rows they keep, `moe_routing.routed_share` of the pass's ``b`` sequences)."""
    s, b, h = run.seq, run.batch, model.hidden_size
    flash = run.framework == "megatron" and run.attention == "flash"
    kept = routed_share(model, s * b, b) if model.num_experts > 1 else 1.0
    saved = saved_bytes(model, run.framework, run.dtype, flash=flash, kept=kept)
    scores = 0.0 if flash else score_bytes(model, s, run.dtype, run.framework)
    return s * b * h * (saved.replicated + saved.parallel + saved.routed + scores)


def grad_itemsize_bytes(dtype: Dtype) -> int:
    """Bytes per gradient element in training (as reduced over DP): fp32 main gradients for
    fp32, bf16 and fp8, 16-bit for fp16. Megatron-LM trains fp8 on top of ``--bf16``, which
    forces ``accumulate_allreduce_grads_in_fp32`` (megatron/training/arguments.py): its grad
    buffer and DP reduction are fp32 (it counted fp8's as 16-bit)."""
    return 2 if dtype is Dtype.FP16 else 4


def param_itemsize_bytes(dtype: Dtype) -> int:
    """Bytes per model-weight element (fp8 training keeps 16-bit weights)."""
    return max(2, ITEMSIZE_BYTES[dtype])


def checkpoint_bytes(num_params: float, dtype: Dtype) -> float:
    """Bytes of a training checkpoint: the weights (`param_itemsize_bytes`), their fp32 master
    copy when they are not fp32 and two fp32 Adam moments, as `step_memory` holds them
    (gradients and activations are not saved)."""
    item = param_itemsize_bytes(dtype)
    return num_params * (item + (0 if item == 4 else 4) + 8)


def step_memory(
    *,
    num_params: float,
    item_bytes: float,
    train: bool,
    activations_bytes: float,
    gpu: GPUSpec,
    grad_bytes: float | None = None,
) -> MemoryEstimate:
    """Weights, and when training gradients plus Adam state (two fp32 moments, and an fp32
    master copy for 16-bit types), plus the given activations, against the GPU's memory.
    fp8 training keeps 16-bit weights (Transformer Engine casts to fp8 per GEMM;
    `param_itemsize_bytes`); fp8 inference holds 1-byte weights. Gradients take the weights'
    element size unless ``grad_bytes`` says otherwise (Megatron-LM's fp32 main gradients:
    `grad_itemsize_bytes`)."""
    weights = num_params * (max(2.0, item_bytes) if train else item_bytes)
    if train:
        grads = weights if grad_bytes is None else num_params * grad_bytes
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
        fits=total <= usable_bytes(gpu),
    )


def estimate_memory(model: ModelSpec, run: Workload, gpu: GPUSpec) -> MemoryEstimate:
    """Weights, gradients, Adam state and activations of one training step or inference
    (the weights with TransformerEngine's cached fp8 copies when training in fp8; inference
    in Megatron's fp8 holds 1-byte weights for the GEMMs TE runs in fp8, `gemm_weights`, and
    bf16 for the rest, whose ops run in bf16: the token table, the output head, norms, the
    MoE router, biases; `inventory_megatron`)."""
    item = ITEMSIZE_BYTES[run.dtype]
    # the output layer is no fp8 GEMM under TransformerEngine: bf16 logits
    logit_item = activation_itemsize_bytes(run.dtype, run.framework)
    logits = float(run.logit_rows * model.vocab_size * logit_item)
    train = run.mode == "train"
    if train:
        acts = model.total_layers * layer_activation_bytes(model, run) + 2.0 * logits
    else:
        acts = 2.0 * layer_activation_bytes(model, run) + logits
    n = float(model.num_params())
    # Megatron-LM accumulates and reduces fp32 main gradients (16-bit for fp16), as the
    # distributed memory counts them; HF eager keeps its gradients in the weights' type
    grads = grad_itemsize_bytes(run.dtype) if run.framework == "megatron" else None
    mem = step_memory(
        num_params=n,
        item_bytes=item,
        train=train,
        activations_bytes=acts,
        gpu=gpu,
        grad_bytes=grads,
    )
    if not te_fp8(run.dtype, run.framework):
        return mem
    gemm = gemm_weights(model, model.num_layers)[0]
    if train:  # TE's cached fp8 weights and transposes, as `dist_memory` counts them
        extra = FP8_WEIGHT_CACHE_BYTES_PER_ELEMENT * gemm
    else:  # only TE's linears hold fp8 weights: the tables, head, norms and router stay bf16
        extra = (n - gemm) * (activation_itemsize_bytes(run.dtype, run.framework) - item)
    total = mem.total_bytes + extra
    update = {"weights_bytes": mem.weights_bytes + extra, "total_bytes": total}
    return mem.model_copy(update={**update, "fits": total <= usable_bytes(gpu)})
