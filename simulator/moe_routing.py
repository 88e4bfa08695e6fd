"""Which experts of one GPU a MoE layer's routed rows reach, and how many rows each runs.

Routing is modelled as uniform and independent: each of the ``tokens`` a GPU routes picks
``k`` distinct experts of ``E``, each expert equally likely. An expert-parallel shard holds
``local = E / ep`` of them and, after the all-to-all, receives the picks of the ``tokens x
ep`` tokens of its expert-parallel group that land on them: ``tokens x k`` rows on average
(balanced over the shards). A given expert is missed by one token with probability
``1 - k / E``, so the expected number of a shard's experts that any row reaches is

    ``hit = local x (1 - (1 - k / E) ^ (tokens x ep))``

(``k`` at one token and ``ep = 1``: Mixtral's 2 of 8 at batch 1; 5.47 at batch 4, where
``min(E, tokens x k)`` said all 8; all ``local`` once ``tokens x k >> E``). An expert no row
reaches launches no GEMM and reads no weight, so a small decode batch reads only ``hit``
experts' weights. The op list needs a whole number of expert GEMMs: `experts_hit` takes the
nearest one (half up). A pass's expert time is close to linear in the experts it reads (a
decode pass's expert GEMMs are weight reads), so the forecast of an expected time wants the
whole number nearest the expectation: at most half an expert's read off, where rounding up
would add up to a whole one (Mixtral batch 4: 5 of 5.47, where ceil says 6).

`split_rows` spreads the ``tokens x k`` rows over the experts hit as evenly as whole rows
allow, so the GEMM FLOPs are those of the routed rows exactly.

Applied to one GPU's `ModelSpec` shard (its ``local_experts``, ``expert_capacity``):
`expert_groups` gives the (rows, experts) pairs of its expert GEMMs, and from them
`routed_rows`, `routed_share` and `expert_rows`; `routed_experts` the experts hit.
"""

from __future__ import annotations

import math

from simulator.models import ModelSpec


def expected_experts_hit(tokens: int, k: int, num_experts: int, local: int) -> float:
    """Expected experts of a shard holding ``local`` of ``num_experts`` that the rows of
    ``tokens`` tokens a GPU, each routed to ``k`` distinct experts, reach (module docstring)."""
    draws = tokens * (num_experts // local)  # the tokens of the expert-parallel group
    return local * (1.0 - (1.0 - k / num_experts) ** draws)


def experts_hit(tokens: int, k: int, num_experts: int, local: int) -> int:
    """`expected_experts_hit` as the nearest whole number (half up), at least one."""
    return max(1, min(local, math.floor(expected_experts_hit(tokens, k, num_experts, local) + 0.5)))


def split_rows(rows: int, experts: int) -> tuple[tuple[int, int], ...]:
    """``rows`` rows over ``experts`` experts as evenly as whole rows allow: (rows, experts)
    pairs, the busier experts first (one pair when ``experts`` divides ``rows``)."""
    q, extra = divmod(rows, experts)
    groups = ((q + 1, extra), (q, experts - extra))
    return tuple((r, n) for r, n in groups if n > 0 and r > 0)


def expert_groups(model: ModelSpec, tokens: int, sequences: int = 1) -> tuple[tuple[int, int], ...]:
    """(rows, experts) pairs of this GPU's expert GEMMs for ``tokens`` routed tokens in
    ``sequences`` equal sequences, the busier experts first (the all-to-all brings an
    expert-parallel shard ``tokens x experts_per_token`` rows over its ``local_experts``).
    When every local expert is hit (`routed_experts`) and each sequence routes at least one
    row per expert, balanced routing spreads each sequence's ``tokens / sequences x k``
    rows over the ``local`` experts as evenly as whole rows allow, each capped at
    ``expert_capacity`` (HF Switch counts a token's place in its expert's queue along its
    own sequence: a cumsum over the sequence axis; Megatron-core's capacity factor without
    padding drops the rows past it, and with padding a binding cap gives every expert the
    same ``C`` rows); the cap holds per sequence of each of the ``num_experts /
    local_experts`` GPUs whose tokens the all-to-all brings (it capped their sum: at ep 8 a
    64-token cap let one expert run 64 rows, not 8 x 64). The kept rows of the micro-batch
    then spread as evenly as whole rows allow (`split_rows`): the busiest
    expert runs the ceiling and no row is lost (the floor for every expert dropped the
    remainder without any cap). Otherwise (a decode pass, a short prefill) the ``tokens x
    k`` rows spread as evenly as whole rows allow over the experts hit, each at most the
    cap."""
    local = model.local_experts or model.num_experts
    hit = routed_experts(model, tokens)
    per_sequence = tokens // sequences * model.experts_per_token
    cap = model.expert_capacity * (model.num_experts // local)  # 0: no cap
    if hit == local and per_sequence >= local:
        one = split_rows(per_sequence, local)
        kept = sequences * sum(min(rows, cap or rows) * n for rows, n in one)
        return split_rows(kept, local)
    groups = split_rows(tokens * model.experts_per_token, hit)
    if not cap:
        return groups
    capped: dict[int, int] = {}
    for rows, n in groups:
        capped[min(rows, cap * sequences)] = capped.get(min(rows, cap * sequences), 0) + n
    return tuple(capped.items())


def routed_rows(model: ModelSpec, tokens: int, sequences: int = 1) -> int:
    """Rows this GPU's experts run (`expert_groups`): ``tokens x experts_per_token`` unless
    an ``expert_capacity`` drops some; under balanced routing as many leave each GPU of
    the expert-parallel group in its all-to-all as arrive."""
    return sum(rows * n for rows, n in expert_groups(model, tokens, sequences))


def routed_share(model: ModelSpec, tokens: int, sequences: int = 1) -> float:
    """Share of the ``tokens x experts_per_token`` routed rows this GPU's experts run
    (`routed_rows`): 1, or what a binding ``expert_capacity`` keeps. The one source of the
    rows the dispatcher moves (`comm.routed_share`) and the experts save activations for
    (`memory.saved_bytes`)."""
    return routed_rows(model, tokens, sequences) / (tokens * model.experts_per_token)


def expert_rows(model: ModelSpec, tokens: int, sequences: int = 1) -> int:
    """Rows of this GPU's busiest expert (`expert_groups`)."""
    return expert_groups(model, tokens, sequences)[0][0]


def routed_experts(model: ModelSpec, tokens: int) -> int:
    """Experts of this GPU that any of the rows of ``tokens`` routed tokens reach: the
    whole number nearest the expectation under uniform independent routing
    (`experts_hit`: Mixtral's 2 of 8 at batch 1, 4 at batch 2, 5 at batch 4,
    all 8 from batch 10); an expert no row reaches launches no GEMM and reads no weight,
    in HF's loop over the experts hit as in Megatron's."""
    local = model.local_experts or model.num_experts
    return experts_hit(tokens, model.experts_per_token, model.num_experts, local)
