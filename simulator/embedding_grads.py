"""The tied word embedding's gradient all-reduce between the first and the last pipeline stage.

A model that ties its input embedding and output head (`ModelSpec.tied_embeddings`) keeps, under
pipeline parallelism, a copy of the vocabulary-parallel word-embedding table on the first stage
(the embedding) and on the last (the head): each holds its own copy, gradient and optimizer
state (`shard_params.end_tensors`, `dist_memory`) and reduces it over DP with the rest of its
stage's gradients. The two copies stay equal because, after the pipeline flush and the DP
gradient reduction and before the optimizer step, each TP rank of the first stage all-reduces
its ``vocab x embed_width / tp`` gradient shard with the same TP rank of the last stage (the
same DP and CP coordinates): Megatron-LM's "embedding group", ``_allreduce_word_embedding_grads``
in ``finalize_model_grads`` (``allreduce_gradients`` then the same all-reduce in its 2021
``train_step``; DeepSpeed's pipeline engine reduces its tied modules the same way). It is not
overlapped with anything: the step waits for it. Its elements are in the gradient dtype (fp32
main grads, `memory.grad_itemsize_bytes`); with a distributed optimizer it is still the whole
shard's all-reduce. Megatron all-reduces learned position-embedding gradients only when the
pipeline splits an encoder from a decoder (``pipeline_model_parallel_split_rank``), which no
model here does, so they have no collective of their own. One stage (``pp = 1``) or an untied
head: no collective.
"""

from __future__ import annotations

from simulator.comm import collective_s
from simulator.memory import grad_itemsize_bytes
from simulator.parallel import Layout
from simulator.scenario import SimInputs


def embedding_pair(layout: Layout, gpus_per_node: int) -> tuple[int, int]:
    """The two ranks (first stage, last stage) of one embedding group: rank ``r`` and
    ``r + (pp - 1) * tp * cp * dp``. Of the ``tp * cp * dp`` such pairs, the first that spans
    two nodes (stages need not start on a node boundary: 12 ranks on 8-GPU nodes in 2 stages
    pair 0 with 6, inside node 0, but 2 with 8 across), else rank 0's."""
    run = layout.run
    stride = run.tp * run.cp * layout.dp
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
    pair = embedding_pair(layout, inputs.cluster.server.gpus_per_node)
    return collective_s("all-reduce", nbytes, pair, inputs.cluster)
