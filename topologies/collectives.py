"""Collective cost: alpha-beta per tier, protocols, and an NCCL-style choice of algorithm.

time = launch + NCCL's base latency of the (algorithm, protocol) + the phases' latencies + their
data time (phases on one link add, links overlap) + 2 sqrt(depth * data time), under the
protocol chosen (Simple: full bandwidth, pipelined; LL: 0.35 of it, 1/5 the per-step latency,
no chunk pipeline; LL128: 0.92 of it, 0.56 the per-step latency, pipelined; `_phases_s`).
``auto`` takes the fastest (algorithm, protocol) pair, as NCCL's tuner does with its own model.
A group of one rank costs 0 s (and has no bandwidth).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from topologies.algorithms import ALGORITHMS, OPS, Op, Phase, ring_bytes_per_rank
from topologies.cluster import Cluster, GroupLinks
from topologies.spec import TopologyError
from topologies.spine import SpineSlowdown

__all__ = [
    "ALGORITHMS",
    "OPS",
    "PROTOCOLS",
    "CollectiveEstimate",
    "Op",
    "Protocol",
    "busbw_factor",
    "collective_estimate",
    "collective_time_s",
    "ring_bytes_per_rank",
]


@dataclass(frozen=True)
class Protocol:
    """An NCCL protocol: bandwidth and per-step latency relative to Simple, and NCCL's base
    latency per algorithm (the fixed cost of one kernel under this protocol, before any step)."""

    name: str
    bw_factor: float
    latency_factor: float
    pipelined: bool
    base_latency_s: Mapping[str, float]

    def base_s(self, algorithm: str) -> float:
        """NCCL's ``baseLatencies`` entry for ``algorithm``; 0 where NCCL has none."""
        return self.base_latency_s.get(algorithm, 0.0)


# NCCL src/graph/tuning.cc baseLatencies (collectives.md section 3), seconds. Ring and tree
# kernels pay them; NVLS and NVLS_TREE have 0 (their cost is the switch round, `NVLSSpec`);
# the hierarchical ring is a ring kernel; direct (all-to-all, send/recv) runs NCCL's p2p path,
# which the tuner does not price (0).
_BASE_SIMPLE = {"ring": 8.4e-6, "tree": 8.4e-6, "hierarchical": 8.4e-6}
_BASE_LL = {"ring": 6.6e-6, "tree": 6.8e-6, "hierarchical": 6.6e-6}
_BASE_LL128 = {"ring": 14.0e-6, "tree": 14.0e-6, "hierarchical": 14.0e-6}

PROTOCOLS: dict[str, Protocol] = {
    "simple": Protocol("simple", 1.0, 1.0, pipelined=True, base_latency_s=_BASE_SIMPLE),
    # LL: 4 B data + 4 B flag per 8 B, so at most half the bandwidth (NCCL's ring LL busBw =
    # min(llMaxBw, 0.5 x busBw)); 0.35 is fitted inside the measured 25-50 % of peak
    # (collectives.md section 4): 0.5 over-predicts the Azure 1-8 MiB all-reduce points by up
    # to 30 %, and the ZeRO-3 Megatron anchors (LL rings over 100+ nodes, where NCCL's llMaxBw
    # cap binds) by up to 25 %. Per-hop latency about 1/5 of Simple in NCCL's hwLatencies
    # (NVLink 0.6 vs 3.4 us, NET 2.7 vs 14 us).
    "ll": Protocol("ll", 0.35, 0.2, pipelined=False, base_latency_s=_BASE_LL),
    # LL128: 120 B data + 8 B flag per 128 B; NCCL prices its busBw at 0.92 x Simple's and its
    # NVLink ring hop at 1.9 us against Simple's 3.4 (0.56; NET 4.0 vs 14: 0.29, PCI 2.5 vs 5.7:
    # 0.44; the NVLink ratio is taken, the fabric LL128 is best on, collectives.md section 4)
    "ll128": Protocol("ll128", 0.92, 0.56, pipelined=True, base_latency_s=_BASE_LL128),
}
SIMPLE_ONLY = frozenset({"nvls"})


@dataclass(frozen=True)
class CollectiveEstimate:
    """The predicted time of one collective and the algorithm that achieves it."""

    op: Op
    nbytes: float
    num_ranks: int
    time_s: float
    algorithm: str
    protocol: str

    @property
    def algbw_bytes_per_s(self) -> float:
        """nccl-tests algorithm bandwidth S / t; a `TopologyError` for a group of one rank
        (0 s: there is no bandwidth to report, and inf is not valid JSON)."""
        if self.time_s <= 0:
            raise TopologyError(
                f"{self.op} over {self.num_ranks} rank moves no data (0 s), so it has no "
                "bandwidth; use --gpus 2 or more"
            )
        return self.nbytes / self.time_s

    @property
    def busbw_bytes_per_s(self) -> float:
        """nccl-tests bus bandwidth: algbw times the op's correction factor."""
        return self.algbw_bytes_per_s * busbw_factor(self.op, self.num_ranks)


def busbw_factor(op: Op, n: int) -> float:
    """busbw / algbw as nccl-tests defines it (doc/PERFORMANCE.md)."""
    if n <= 1:
        return 1.0
    if op == "all-reduce":
        return 2 * (n - 1) / n
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        return (n - 1) / n
    return 1.0


def _phases_s(phases: list[Phase], proto: Protocol, *, base_s: float = 0.0) -> float:
    """Latencies add; data on the same link adds; different links overlap (one pipeline)."""
    latency = sum(p.latency_s for p in phases) * proto.latency_factor
    per_link: dict[str, float] = {}
    for p in phases:
        bw = p.bw_bytes_per_s * proto.bw_factor
        data = p.wire_bytes / bw if bw > 0 else math.inf
        per_link[p.link] = per_link.get(p.link, 0.0) + data
    data_s = max(per_link.values(), default=0.0)
    # one chain of phases: all of its latency but its longest single step (a phase's last step
    # is latency_s - depth_s); summing each phase's depth_s dropped one step per phase, so a
    # chain of one-step phases had no fill at all
    last_step_s = max((p.latency_s - p.depth_s for p in phases), default=0.0)
    depth = max(0.0, sum(p.latency_s for p in phases) - last_step_s)
    pipe_s = 2 * math.sqrt(depth * data_s) if proto.pipelined and data_s < math.inf else 0.0
    return base_s + latency + data_s + pipe_s


def _best_for(name: str, op: Op, nbytes: float, g: GroupLinks) -> tuple[float, str] | None:
    phases = ALGORITHMS[name](op, nbytes, g)
    if phases is None:
        return None
    protos = [PROTOCOLS["simple"]] if name in SIMPLE_ONLY else list(PROTOCOLS.values())
    return min((_phases_s(phases, pr, base_s=pr.base_s(name)), pr.name) for pr in protos)


def _check(op: str, nbytes: float, algorithm: str) -> None:
    if op not in OPS:
        raise TopologyError(f"unknown op {op!r}; use one of: {', '.join(OPS)}")
    if not nbytes > 0 or not math.isfinite(nbytes):
        raise TopologyError(f"--bytes must be a positive number, got {nbytes}")
    if algorithm != "auto" and algorithm not in ALGORITHMS:
        raise TopologyError(f"unknown algorithm {algorithm!r}; use auto or {', '.join(ALGORITHMS)}")


def collective_estimate(
    op: Op,
    nbytes: float,
    ranks: Sequence[int],
    cluster: Cluster,
    *,
    algorithm: str = "auto",
    spine: SpineSlowdown | None = None,
) -> CollectiveEstimate:
    """Predict one collective over ``ranks`` of ``cluster``.

    Args:
        op: one of `OPS`.
        nbytes: the nccl-tests size S in bytes (> 0).
        ranks: the group's global ranks.
        cluster: where the ranks live.
        algorithm: ``auto`` (fastest, like NCCL's tuner) or a key of `ALGORITHMS`.
        spine: where the group's traffic leaves a leaf, these slowdowns in place of those
            its own placement gives (`Cluster.p2p_spine`: a pipeline hop is one of a
            stage's many pairs).

    Returns:
        The time, algorithm and protocol; bandwidths as properties.
    """
    _check(op, nbytes, algorithm)
    g = cluster.group_links(ranks)
    if spine is not None and g.spine != SpineSlowdown():
        g = replace(g, spine=spine)
    if g.size == 1:
        return CollectiveEstimate(op, nbytes, 1, 0.0, "none", "none")
    names = list(ALGORITHMS) if algorithm == "auto" else [algorithm]
    found = [(best, name) for name in names if (best := _best_for(name, op, nbytes, g))]
    if not found:
        raise TopologyError(
            f"algorithm {algorithm!r} does not apply to {op} on this group "
            f"({g.num_nodes} nodes x {g.ranks_per_node} ranks); use --algorithm auto"
        )
    (time_s, proto), name = min(found)
    return CollectiveEstimate(op, nbytes, g.size, g.launch_latency_s + time_s, name, proto)


def collective_time_s(
    op: Op, nbytes: float, ranks: Sequence[int], cluster: Cluster, *, algorithm: str = "auto"
) -> float:
    """Seconds for one collective (see `collective_estimate`)."""
    return collective_estimate(op, nbytes, ranks, cluster, algorithm=algorithm).time_s
