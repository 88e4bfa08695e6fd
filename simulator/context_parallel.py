"""Context parallelism: the attention core's CP ring steps after the first.

The attention core runs ``cp`` ring steps of ``(S/cp) x (S/cp)`` blocks; causal,
TransformerEngine's load-balanced ring (``AttnFuncWithCPAndKVP2P``: rank ``r`` holds chunks
``r`` and ``2cp - 1 - r`` of ``2cp``) runs step 0 causal over its own ``S/cp`` tokens and
``cp - 1`` unmasked half steps, ``S/cp`` queries against the first half of a lower rank's K,V
or the second ``S/(2cp)`` queries against a higher rank's: ``c (S + 1)`` pairs per rank at
``c = S / (2cp)``, the causal matrix over ``cp``. Rank ``cp - 1`` runs every half step as the
first kind, rank 0 as the second, the others a mix; the slowest rank sets the layer, so each
half step is priced at the slower kernel (`stagecost.ShardKernels.ring_fw`).
"""

from __future__ import annotations

from forecast.kernels import ATTENTION_BACKWARD_OPS, CAUSAL_ATTENTION_OPS, KernelSpec

# kernels with their launch counts (`stagecost.ShardKernels` holds them in this form)
Counted = tuple[tuple[KernelSpec, int], ...]


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
