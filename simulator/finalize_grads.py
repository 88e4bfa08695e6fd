"""The collectives Megatron-LM's ``finalize_model_grads`` runs once a step, after the DP gradient
reduction (``finish_grad_sync``) and before the optimizer step, in this order: sequence
parallelism's norm-gradient all-reduce over the TP group, then a tied word embedding's
all-reduce between the first and the last pipeline stage. Neither overlaps anything: the step
waits for them. Both move main gradients (fp32 for bf16 and fp8, `memory.grad_itemsize_bytes`).

**Norm gradients under sequence parallelism** (`norm_grad_sync_s`). With sequence
parallelism each TP rank runs the norms, and adds the row-parallel linears' biases, on its own
``s / tp`` tokens, so the gradients of those parameters (held whole on every TP rank,
`shard_params.replicated_layer_params`) are partial sums. ``_allreduce_layernorm_grads``
gathers every parameter marked ``sequence_parallel`` of all the stage's model chunks into one
flat buffer and all-reduces it over the TP group: the LayerNorm weights and biases (RMSNorm:
weights; TransformerEngine's norms and ``LayerNormLinear`` mark them), the final norm on the
stage that holds the last layer, the row-parallel biases (the attention projection's and
fc2's: Megatron-core's ``RowParallelLinear``, TE's ``Linear`` in row mode) and a MoE layer's
router weight (``TopKRouter``); an expert's own biases are not counted. Megatron-core also adds
QK-norm weights (``q_layernorm``/``k_layernorm``, even without sequence parallelism); no model
here has them. One TP rank or no sequence parallelism: no collective.

**Tied word embedding** (`embedding_grad_sync_s`). A model that ties its input embedding and
output head (`ModelSpec.tied_embeddings`) keeps, under pipeline parallelism, a copy of the
vocabulary-parallel word-embedding table on the first stage (the embedding) and on the last
(the head): each holds its own copy, gradient and optimizer state (`shard_params.end_tensors`,
`dist_memory`) and reduces it over DP with the rest of its stage's gradients. The two copies
stay equal because each TP rank of the first stage all-reduces its ``vocab x embed_width / tp``
gradient shard with the same TP rank of the last stage (the same DP and CP coordinates):
Megatron-LM's "embedding group", ``_allreduce_word_embedding_grads`` (``allreduce_gradients``
then the same all-reduce in its 2021 ``train_step``; DeepSpeed's pipeline engine reduces its
tied modules the same way). With a distributed optimizer it is still the whole shard's
all-reduce. Megatron all-reduces learned position-embedding gradients only when the pipeline
splits an encoder from a decoder (``pipeline_model_parallel_split_rank``), which no model here
does, so they have no collective of their own. One stage (``pp = 1``) or an untied head: no
collective.
"""

from __future__ import annotations

from simulator.comm import collective_s
from simulator.memory import grad_itemsize_bytes
from simulator.models import ModelSpec
from simulator.parallel import Layout
from simulator.scenario import SimInputs
from simulator.shard_params import replicated_layer_params
from topologies.spine import shift_share


def embedding_pair(layout: Layout, gpus_per_node: int) -> tuple[int, int]:
    """The two ranks (first stage, last stage) of one embedding group: rank ``r`` and
    ``r + (pp - 1) * tp * cp * dp``. Of the ``tp * cp * dp`` such pairs, the first that spans
    two nodes (stages need not start on a node boundary: 12 ranks on 8-GPU nodes in 2 stages
    pair 0 with 6, inside node 0, but 2 with 8 across), else rank 0's."""
    run, stride = layout.run, layout.stage_ranks
    gap = (run.pp - 1) * stride
    across = (r for r in range(stride) if r // gpus_per_node != (r + gap) // gpus_per_node)
    first = next(across, 0)
    return first, first + gap


def embedding_grad_bytes(inputs: SimInputs, layout: Layout) -> float:
    """Bytes each rank of an embedding group all-reduces: its ``1 / tp`` shard of the word
    table's gradient, ``vocab x embed_width / tp`` elements in the gradient dtype; 0.0 when
    the head is untied or there is one stage."""
    m, run = inputs.model, layout.run
    if run.pp == 1 or not m.tied_embeddings:
        return 0.0
    return m.vocab_size * m.embed_width / run.tp * grad_itemsize_bytes(inputs.dtype)


def embedding_grad_sync_s(inputs: SimInputs, layout: Layout) -> float:
    """Seconds of the tied word embedding's gradient all-reduce (module docstring); 0.0 when
    there is none."""
    nbytes = embedding_grad_bytes(inputs, layout)
    if nbytes <= 0:
        return 0.0
    cl, run = inputs.cluster, layout.run
    pair = embedding_pair(layout, cl.server.gpus_per_node)
    # every first-stage rank reduces with its last-stage twin at once (`Cluster.p2p_spine`)
    spine = cl.p2p_spine(shift_share, run.pp * layout.stage_ranks, pair[1] - pair[0], False)
    return collective_s("all-reduce", nbytes, pair, cl, spine)


def norm_grad_params(model: ModelSpec, layout: Layout) -> tuple[float, ...]:
    """Per stage, the elements of the TP all-reduce under sequence parallelism (module
    docstring): over every chunk of the stage, each layer's norms and row-parallel biases
    (`replicated_layer_params`), a MoE layer's ``h x E`` router weight, and the final norm on
    the chunk that holds the last layer; zeros without sequence parallelism or at ``tp = 1``."""
    run, pp, v = layout.run, layout.run.pp, layout.chunks
    if not (run.sequence_parallel and run.tp > 1):
        return (0.0,) * pp
    dense = replicated_layer_params(model, moe=False)
    moe = replicated_layer_params(model, moe=True) + model.hidden_size * model.num_experts
    final = (2 if model.norm == "layernorm" else 1) * model.hidden_size
    out = []
    for s in range(pp):
        total = 0
        for c, layers in enumerate(layout.layers_per_stage[s]):
            experts = model.moe_layers(layers)
            total += (layers - experts) * dense + experts * moe
            total += final if c * pp + s == pp * v - 1 else 0
        out.append(float(total))
    return tuple(out)


def norm_grad_bytes(inputs: SimInputs, layout: Layout) -> tuple[float, ...]:
    """Per stage, bytes of the norm-gradient all-reduce over the TP group (`norm_grad_params`
    in the main-gradient dtype)."""
    itemsize = grad_itemsize_bytes(inputs.dtype)
    return tuple(n * itemsize for n in norm_grad_params(inputs.model, layout))


def norm_grad_sync_s(inputs: SimInputs, layout: Layout) -> tuple[float, ...]:
    """Per stage, seconds of the norm-gradient all-reduce over the TP group (module
    docstring); 0.0 where there is none."""
    group, cluster = layout.tp_group, inputs.cluster
    sizes = norm_grad_bytes(inputs, layout)
    return tuple(collective_s("all-reduce", nbytes, group, cluster) for nbytes in sizes)
