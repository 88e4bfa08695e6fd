"""Tensor parallelism of serving: the part of a model one GPU holds, and each pass's collectives.

Megatron-style, as vLLM runs it, on ``tp`` GPUs of one server: each GPU holds ``1 / tp`` of
the heads, FFN columns and vocabulary (`shard`; KV heads are replicated where ``tp`` exceeds
them, one a GPU), and each pass adds blocking collectives over NVLink (`comm.collective_s`):
two all-reduces of the pass's ``tokens x hidden`` activations a layer (attention and MLP
outputs), one after the vocabulary-parallel embedding, and an all-gather of the last tokens'
logits (`tp_comm_s`). Both move the hidden states' element type
(`memory.activation_itemsize_bytes`): bf16 under Megatron's fp8, whose GEMMs return bf16 and
whose output layer is a bf16 GEMM, as the training collectives count them (`comm`).
"""

from __future__ import annotations

from simulator.comm import collective_s
from simulator.errors import ConfigError
from simulator.memory import activation_itemsize_bytes
from simulator.models import ModelSpec
from simulator.opgraph import Workload
from simulator.stagecost import tp_shard
from topologies import Cluster


def shard(model: ModelSpec, tp: int) -> ModelSpec:
    """The part of ``model`` one of ``tp`` GPUs holds (module docstring); a split the heads
    do not allow is a `ConfigError`."""
    if tp == 1:
        return model
    kv = model.kv_heads
    if model.num_heads % tp or (kv % tp and tp % kv):
        raise ConfigError(
            f"--tp {tp}: {model.id}'s {model.num_heads} heads ({kv} KV heads) do not split "
            f"over {tp} GPUs; use a tp that divides the heads and divides or is a multiple "
            "of the KV heads"
        )
    return tp_shard(model, tp)


def tp_comm_s(model: ModelSpec, run: Workload, tp: int, cluster: Cluster | None) -> float:
    """Seconds of one pass's tensor-parallel collectives (module docstring)."""
    if tp == 1:
        return 0.0
    if cluster is None:
        raise ConfigError(f"--tp {tp} needs the server the GPUs sit in; give --server")
    ranks = range(tp)
    item = activation_itemsize_bytes(run.dtype, run.framework)
    activations = float(run.tokens * model.hidden_size * item)
    reduce_s = collective_s("all-reduce", activations, ranks, cluster)
    logits = float(run.logit_rows * model.vocab_size * item)
    gather_s = collective_s("all-gather", logits, ranks, cluster)
    return (2 * model.total_layers + 1) * reduce_s + gather_s
