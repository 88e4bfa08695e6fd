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
"""

from __future__ import annotations

import math


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
