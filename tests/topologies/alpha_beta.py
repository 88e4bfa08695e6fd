"""The alpha-beta part of a collective's time: its estimate less NCCL's base latency.

Closed-form tests zero every latency they can reach (launch, per step, NVLS) and compare the
bandwidth term; NCCL's per-(algorithm, protocol) base latency is a constant of the model
(`topologies.collectives.PROTOCOLS`), tested on its own in test_small_messages.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from topologies import Cluster, CollectiveEstimate, collective_estimate
from topologies.collectives import PROTOCOLS


def base_s(est: CollectiveEstimate) -> float:
    """NCCL's base latency the estimate paid (0 for a group of one)."""
    proto = PROTOCOLS.get(est.protocol)
    return proto.base_s(est.algorithm) if proto else 0.0


def ab_time_s(est: CollectiveEstimate) -> float:
    """The estimate's time less NCCL's base latency."""
    return est.time_s - base_s(est)


def ab_t(
    op: str, nbytes: float, ranks: Sequence[int], c: Cluster, *, algorithm: str = "auto"
) -> float:
    """`collective_time_s` less NCCL's base latency."""
    est = collective_estimate(op, nbytes, ranks, c, algorithm=algorithm)  # type: ignore[arg-type]
    return ab_time_s(est)
