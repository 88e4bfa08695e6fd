"""Context parallelism: the attention core's kernels and collectives under each CP schedule.

The attention core runs ``cp`` ring steps of ``(S/cp) x (S/cp)`` blocks; causal,
TransformerEngine's load-balanced ring (``AttnFuncWithCPAndKVP2P``: rank ``r`` holds chunks
``r`` and ``2cp - 1 - r`` of ``2cp``) runs step 0 causal over its own ``S/cp`` tokens and
``cp - 1`` unmasked half steps, ``S/cp`` queries against the first half of a lower rank's K,V
or the second ``S/(2cp)`` queries against a higher rank's: ``c (S + 1)`` pairs per rank at
``c = S / (2cp)``, the causal matrix over ``cp``. Rank ``cp - 1`` runs every half step as the
first kind, rank 0 as the second, the others a mix; the slowest rank sets the layer, so each
half step is priced at the slower kernel (`stagecost.ShardKernels.ring_fw`).

The ring's sends (TransformerEngine's ``flash_attn_p2p_communicate``, one batched send to the
next rank and receive from the previous one a step) overlap the attention of the same step
only, so each step exposes its own excess (`fw_exposed_s`, `bw_exposed_s`). Forward, step
``i < cp - 1`` sends the K,V it holds on while it computes; the last step sends nothing.
Backward runs the steps in reverse (the causal step last) and sends at every step: K,V at the
first, K,V with the dK,dV accumulated so far (one buffer) at the ``cp - 2`` middle ones, dK,dV
alone at the last: ``2 (cp - 1)`` K,V volumes in all.

Megatron-LM's ``--cp-comm-type`` (``RunConfig.cp_comm_type``) picks the ring above (``p2p``,
the default) or one of two schedules whose collectives block the attention core
(`blocking_collectives`; nccl-tests sizes, one collective per tensor as TransformerEngine
issues them): ``all_gather`` (``AttnFuncWithCPAndKVAllGather``, Llama 3's: "KV all-gather
between CP ranks is exposed") all-gathers K and V before the forward, again before the
backward (it saves only its own shard), and reduce-scatters dK and dV after it; ``a2a``
(``AttnFuncWithCPAndQKVOA2A``, DeepSpeed-Ulysses) all-to-alls Q, K and V from a sequence
split to a head split before the core and the output back after it, and in backward the
output and its gradient, then dQ, dK and dV. ``a2a+p2p`` (hierarchical) is not modelled.

Each prices its attention core with its own kernels (`schedule_core`; the same kernel forecasts,
forward and backward), ``S (S + 1) / (2 cp)`` causal pairs a rank a head in all three, exactly.
What follows is read from TransformerEngine's
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py (NVIDIA/
TransformerEngine, commit 015d225):

* ``all_gather`` (``AttnFuncWithCPAndKVAllGather``): rank ``r`` keeps its query halves,
  chunks ``r`` and ``2cp - 1 - r`` (``local_seq_chunk_ids``), and after the gather runs one
  kernel per half, ``S/(2cp)`` queries against the K,V prefix that half may attend to:
  ``get_kv_seq_info_after_all_gather`` gives chunk ``c`` keys ``[0, (c + 1) S/(2cp))`` under the
  default causal window ``(-1, 0)``, the mask bottom-right aligned (``_bottom_right`` for the
  fused backend), all ``S`` keys without a causal mask; the backward runs the same two shapes.
  The two kernels run on two streams ("to resolve wave quantization issue of Flash Attn"); they
  are priced one after the other, and the slowest rank sets the layer (rank ``cp - 1`` holds the
  middle chunks, rank 0 the shortest and the longest prefix). The gathered K,V and the
  backward's whole-sequence dK,dV are memory of their own (`gathered_kv_units`).
* ``a2a`` (``AttnFuncWithCPAndQKVOA2A``): after ``flash_attn_a2a_communicate`` of Q, K, V a
  rank holds the whole sequence (its chunks reordered to natural order,
  ``reorder_seq_chunks_for_a2a_before_attn``) on ``heads / cp`` of a TP rank's heads and runs one
  attention over it (one ``flash_attn_fwd`` / ``fused_attn_fwd`` with ``causal``, one backward):
  ``(b heads / (tp cp), S, S, d)``, causal where the model's is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from forecast.kernels import ATTENTION_BACKWARD_OPS, CAUSAL_ATTENTION_OPS, KernelSpec, OpFamily
from simulator.errors import ConfigError
from topologies.algorithms import Op

# one collective of a CP schedule: (op, nccl-tests size S in bytes)
CpCollective = tuple[Op, float]


def blocking_collectives(
    comm_type: str, cp: int, q_bytes: float, kv_bytes: float
) -> tuple[tuple[CpCollective, ...], tuple[CpCollective, ...]]:
    """The forward and the backward collectives over the CP group of one layer's attention core
    for one micro-batch under ``all_gather`` or ``a2a`` (module docstring); none for ``p2p``
    (its sends are `fw_exposed_s`'s) or at ``cp = 1``. ``q_bytes``: a rank's own Q (``b s/cp
    heads/tp dhead``, as large as the core's output); ``kv_bytes``: its own K and V together."""
    if cp == 1 or comm_type == "p2p":
        return (), ()
    k = kv_bytes / 2  # K or V alone
    if comm_type == "all_gather":
        gather: CpCollective = ("all-gather", cp * k)  # S: the whole sequence's K (or V)
        scatter: CpCollective = ("reduce-scatter", cp * k)
        return (gather, gather), (gather, gather, scatter, scatter)
    if comm_type == "a2a":  # S: a rank's own tensor; (cp - 1) / cp of it leaves
        q: CpCollective = ("all-to-all", q_bytes)
        kv: CpCollective = ("all-to-all", k)
        return (q, kv, kv, q), (q, q, q, kv, kv)
    raise ValueError(comm_type)


# kernels with their launch counts (`stagecost.ShardKernels` holds them in this form)
Counted = tuple[tuple[KernelSpec, int], ...]
# an attention kernel's (BH, S_q, S_kv), its head dim aside
Dims = tuple[int, int, int]


def check_attention(cp: int, attention: str) -> None:
    """A `ConfigError` for a CP ring without fused attention: Megatron-core runs context
    parallelism in TransformerEngine's attention only (its own ``DotProductAttention`` asserts
    ``context_parallel_size == 1``), and TE's ring in its flash and cuDNN fused backends only
    (no unfused one, no fp32)."""
    if cp > 1 and attention != "flash":
        raise ConfigError(
            f"run.cp: {cp} runs TransformerEngine's ring attention, flash attention only, but "
            f"this scenario runs {attention} attention (fp32/tf32, framework hf-eager, "
            "training.attention or a GPU without FlashAttention): set run.cp = 1"
        )


def ring_steps(step0: Counted, cp: int) -> tuple[Counted, ...]:
    """The kernels of one CP ring step after the first, as alternatives (module docstring):
    a causal core's two unmasked half steps, the ``S/cp x S/(2cp)`` and ``S/(2cp) x S/cp``
    blocks; any other core (non-causal, GEMM-shaped or unfused) its step-0 kernels again."""
    if cp == 1:
        return ()
    if not any(k.op in CAUSAL_ATTENTION_OPS for k, _ in step0):
        return (step0,)

    def half(queries: bool) -> Counted:
        out: list[tuple[KernelSpec, int]] = []
        for k, n in step0:
            if k.op in CAUSAL_ATTENTION_OPS:
                bh, s_q, s_kv, d = k.dims
                q, kv = (max(1, s_q // 2), s_kv) if queries else (s_q, max(1, s_kv // 2))
                op = "attention_bwd" if k.op in ATTENTION_BACKWARD_OPS else "attention"
                k = KernelSpec(k.family, (bh, q, kv, d), k.dtype, op)
            out.append((k, n))
        return tuple(out)

    return (half(queries=False), half(queries=True))


def schedule_core(comm_type: str, step0: Counted, cp: int) -> tuple[Counted, ...]:
    """The attention core of one layer as ``all_gather`` or ``a2a`` runs it (module docstring),
    in place of ring step 0 and the ring, as alternatives of which the slowest rank's sets the
    layer (one per rank for ``all_gather``); empty for ``p2p``, at ``cp = 1`` and for a core
    without an attention kernel (GEMM-shaped stand-ins), which `ring_steps` prices."""
    attention = any(k.family is OpFamily.ATTENTION for k, _ in step0)
    if cp == 1 or comm_type == "p2p" or not attention:
        return ()
    if comm_type == "a2a":
        return (_reshaped(step0, partial(_ulysses_dims, cp=cp)),)
    if comm_type != "all_gather":
        raise ValueError(comm_type)
    ranks = (_reshaped(step0, partial(_gathered_dims, cp=cp, rank=r)) for r in range(cp))
    return tuple(dict.fromkeys(ranks))  # non-causal: every rank runs the same two kernels


def _ulysses_dims(k: KernelSpec, *, cp: int) -> tuple[Dims, ...]:
    """``a2a``'s one kernel for step-0 kernel ``k``: ``heads / cp`` over the whole sequence."""
    bh, s_q, s_kv, _ = k.dims
    return ((bh // cp, s_q * cp, s_kv * cp),)


def _gathered_dims(k: KernelSpec, *, cp: int, rank: int) -> tuple[Dims, ...]:
    """``all_gather``'s two kernels on ``rank`` for step-0 kernel ``k``: each query half (chunks
    ``rank`` and ``2cp - 1 - rank`` of ``2cp``) against its causal K,V prefix, or all keys."""
    bh, s_q, s_kv, _ = k.dims
    half = max(1, s_q // 2)
    if k.op not in CAUSAL_ATTENTION_OPS:
        return tuple((bh, half, s_kv * cp) for _ in range(2))
    return tuple((bh, half, (c + 1) * max(1, s_kv // 2)) for c in (rank, 2 * cp - 1 - rank))


def _reshaped(step0: Counted, dims: Callable[[KernelSpec], tuple[Dims, ...]]) -> Counted:
    """``step0`` with each attention kernel replaced by kernels of the same op of shapes ``dims``
    (``(BH, S_q, S_kv)``; the head dim kept)."""
    out: list[tuple[KernelSpec, int]] = []
    for k, n in step0:
        if k.family is not OpFamily.ATTENTION:
            out.append((k, n))
            continue
        out += [(KernelSpec(k.family, (*d, k.dims[3]), k.dtype, k.op), n) for d in dims(k)]
    return tuple(out)


def without(kernels: Counted, part: Counted) -> Counted:
    """``kernels`` less one of each of ``part``'s (a layer less its ring step 0)."""
    rest = list(kernels)
    for kn in part:
        rest.remove(kn)
    return tuple(rest)


def gathered_kv_units(comm_type: str, cp: int, *, causal: bool = True) -> float:
    """Peak whole-sequence K,V-sized temporaries of one layer's attention core under
    ``all_gather``, in units of the whole sequence's K and V on one TP rank; 0 otherwise. The
    backward's peak (TransformerEngine's ``AttnFuncWithCPAndKVAllGather.backward``): the
    re-gathered K and V (1), the whole-sequence dK, dV it accumulates (``torch.zeros`` of ``cp``
    shards: 1), each query half's dK, dV over its K,V prefix (``(2cp + 1) / (2cp)``: the two
    prefixes span ``S + S/(2cp)`` keys, both kept to the end; without a causal mask each half
    sees all ``S`` keys: 2), and the reorder copy of dK, then of dV, before the reduce-scatter
    (1/2). The forward holds the gathered K and V alone (1)."""
    if cp == 1 or comm_type != "all_gather":
        return 0.0
    per_half = (2 * cp + 1) / (2 * cp) if causal else 2.0
    return 1.0 + 1.0 + per_half + 0.5


@dataclass(frozen=True, slots=True)
class RingTimes:
    """Seconds of one layer's attention core per CP ring step on the slowest rank: step 0
    (causal over a rank's own tokens) and each of the ``cp - 1`` others, forward and backward."""

    step0_fw_s: float = 0.0
    step_fw_s: float = 0.0
    step0_bw_s: float = 0.0
    step_bw_s: float = 0.0


def fw_exposed_s(cp: int, kv_s: float, ring: RingTimes) -> float:
    """Forward ring time not hidden: ``kv_s`` (one step's send of a rank's K,V) past step 0's
    attention, and past each of the ``cp - 2`` next steps'; the last step sends nothing."""
    if cp == 1:
        return 0.0
    return max(0.0, kv_s - ring.step0_fw_s) + (cp - 2) * max(0.0, kv_s - ring.step_fw_s)


def bw_exposed_s(cp: int, kv_s: float, kv_grad_s: float, ring: RingTimes) -> float:
    """Backward ring time not hidden (module docstring): K,V (``kv_s``) past the first
    step's attention backward, K,V with dK,dV (``kv_grad_s``) past each of the ``cp - 2``
    middle steps', dK,dV (``kv_s``) past the last, causal step's."""
    if cp == 1:
        return 0.0
    first = max(0.0, kv_s - ring.step_bw_s)
    middle = (cp - 2) * max(0.0, kv_grad_s - ring.step_bw_s)
    return first + middle + max(0.0, kv_s - ring.step0_bw_s)
