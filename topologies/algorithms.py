"""Collective algorithms as lists of phases: ring, tree, NVLS, hierarchical and direct.

Each algorithm maps (op, bytes, group) to the `Phase` list it runs, or None where it does not
apply (as NCCL's tuner allows: tree for all-reduce only; across nodes NVLS runs as NVLS_TREE,
for all-reduce only). ``nbytes`` is the nccl-tests size S: the buffer for all-reduce,
broadcast and reduce, the total array for all-gather and reduce-scatter, the total sent by one
rank for all-to-all. Formulas: shared/data/hardware/collectives.md sections 1-3.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from topologies.cluster import GroupLinks

Op = Literal[
    "all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all", "send-recv"
]
OPS: tuple[Op, ...] = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "broadcast",
    "reduce",
    "all-to-all",
    "send-recv",
)


@dataclass(frozen=True)
class Phase:
    """One pipelined stage: bytes each rank sends, at what bandwidth, after what latency.

    ``depth_s`` is the latency of the pipeline a chunk must cross; with the chunk count chosen
    optimally the fill/drain costs ``2 sqrt(depth_s * wire_bytes / bw)`` (classic pipelined
    broadcast segmentation), which is what makes mid-size messages slower than alpha-beta.
    Phases of one algorithm run as one chunk pipeline: phases on the same ``link`` add up,
    different links overlap, and a chunk crosses every phase in turn, so the pipeline's depth is
    their whole latency less one step, the longest (for one phase: its own ``depth_s``).
    """

    wire_bytes: float
    bw_bytes_per_s: float
    latency_s: float
    depth_s: float
    link: str = "intra"


Algorithm = Callable[[Op, float, GroupLinks], list[Phase] | None]


def ring_bytes_per_rank(op: Op, nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring: 2(n-1)/n S for all-reduce, (n-1)/n S for RS/AG."""
    if op == "all-reduce":
        return 2 * (n - 1) / n * nbytes
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        return (n - 1) / n * nbytes
    return nbytes


def _ring_steps(op: Op, n: int) -> int:
    return 2 * (n - 1) if op == "all-reduce" else n - 1


def _ring_phase(op: Op, nbytes: float, n: int, bw: float, step_latency_s: float) -> Phase:
    steps = _ring_steps(op, n)
    latency = steps * step_latency_s
    return Phase(ring_bytes_per_rank(op, nbytes, n), bw, latency, latency * (steps - 1) / steps)


def ring(op: Op, nbytes: float, g: GroupLinks) -> list[Phase] | None:
    """Flat ring over all ranks; crosses each node's NICs once per ring (NCCL rings)."""
    if op in ("all-to-all", "send-recv"):
        return None
    if g.num_nodes == 1:
        bw = g.intra_bw_bytes_per_s
    elif g.ranks_per_node == 1:
        bw = g.inter_bw_for("ring")
    else:
        bw = min(g.intra_bw_bytes_per_s, g.inter_bw_for("ring"))
    steps = _ring_steps(op, g.size)
    inter = (steps // (g.size - 1)) * (g.num_nodes - 1)
    latency = (steps - inter) * g.intra_latency_s + inter * g.inter_latency_s
    depth = latency * (steps - 1) / steps
    return [Phase(ring_bytes_per_rank(op, nbytes, g.size), bw, latency, depth)]


def _tree_node_sends(num_nodes: int) -> float:
    """Bytes a node sends to other nodes per byte of S in a double binary tree all-reduce.

    Each tree carries S/2 up and down; a node is interior (S/2 to its parent, S/2 to each of
    two children: 3 x S/2 out) in one tree and a leaf (S/2 out) in the other, 2S in all, and
    as much in; on 2 nodes each is root of one tree and the other's only child, S in all
    (NCCL's tuner prices trees on <= 2 nodes at the intra-node rate, on more at the
    inter-node one)."""
    return 1.0 if num_nodes == 2 else 2.0


def tree(op: Op, nbytes: float, g: GroupLinks) -> list[Phase] | None:
    """NCCL's tree all-reduce: a chain inside each node, a double binary tree across nodes.

    Every rank of a chain sends 2S (S up, S down: algbw = 0.5 busBw); across nodes each node
    sends `_tree_node_sends` x S over its NICs. Latency O(log nodes). NCCL runs trees for
    all-reduce only (broadcast and reduce: ring; all-gather, reduce-scatter: ring or NVLS)."""
    if op != "all-reduce":
        return None
    hops_intra = 2 * (g.ranks_per_node - 1)
    # whole tree levels: ceil(log2 nodes); collectives.md section 3 writes log2(nNodes), the same
    # for a power of two; other node counts are rounded up here, deliberately (3 nodes: 2 levels)
    hops_inter = 2 * math.ceil(math.log2(g.num_nodes)) if g.num_nodes > 1 else 0
    bw = g.intra_bw_bytes_per_s if g.ranks_per_node > 1 else math.inf
    if g.num_nodes > 1:
        bw = min(bw, g.inter_bw_for("tree") * 2 / _tree_node_sends(g.num_nodes))
    latency = hops_intra * g.intra_latency_s + hops_inter * g.inter_latency_s
    hops = max(1, hops_intra + hops_inter)
    return [Phase(2 * nbytes, bw, latency, latency * (hops - 1) / hops)]


def _nvls_phase(op: Op, nbytes: float, g: GroupLinks) -> Phase | None:
    if g.nvls is None or g.ranks_per_node < 2:
        return None
    n = g.ranks_per_node
    wire = nbytes if op == "all-reduce" else nbytes * (n - 1) / n
    bw = g.intra_line_bw_bytes_per_s * g.nvls.efficiency
    return Phase(wire, bw, g.nvls.latency_s, g.nvls.fill_depth_s)


def _inter_phase(op: Op, nbytes: float, g: GroupLinks) -> Phase:
    """The inter-node ring among ranks with the same local index, on S / ranks_per_node.

    On a PCIe server the NIC traffic crosses the GPU's one x16 link, so it cannot overlap the
    intra-node phases (it runs on link "intra")."""
    per_rank_bw = g.inter_bw_for("ring") / g.ranks_per_node
    p = _ring_phase(op, nbytes / g.ranks_per_node, g.num_nodes, per_rank_bw, g.inter_latency_s)
    link = "intra" if g.nic_on_intra_link else "inter"
    return Phase(p.wire_bytes, p.bw_bytes_per_s, p.latency_s, p.depth_s, link=link)


def _two_level(op: Op, nbytes: float, g: GroupLinks, intra: list[Phase]) -> list[Phase] | None:
    """Intra-node phases plus, across nodes, a ring on 1/ranks_per_node of the data."""
    if g.num_nodes == 1:
        return intra
    if g.ranks_per_node == 1:
        return None
    return [*intra, _inter_phase(op, nbytes, g)]


def _tree_inter_phase(nbytes: float, g: GroupLinks) -> Phase:
    """NVLS_TREE's network part: one double binary tree per rail, each on S / ranks_per_node."""
    per_rank_bw = g.inter_bw_for("tree") / g.ranks_per_node
    wire = _tree_node_sends(g.num_nodes) * nbytes / g.ranks_per_node
    hops = 2 * math.ceil(math.log2(g.num_nodes))
    latency = hops * g.inter_latency_s
    return Phase(wire, per_rank_bw, latency, latency * (hops - 1) / hops, link="inter")


def nvls(op: Op, nbytes: float, g: GroupLinks) -> list[Phase] | None:
    """NVLink SHARP: one switch round inside a node (all-reduce, all-gather, reduce-scatter).

    Across nodes NCCL runs NVLS_TREE, for all-reduce only: NVLS inside each node, a tree per rail
    across nodes (NCCL enables plain NVLS on several nodes only with IB SHARP, not modelled)."""
    if op not in ("all-reduce", "all-gather", "reduce-scatter"):
        return None
    phase = _nvls_phase(op, nbytes, g)
    if phase is None:
        return None
    if g.num_nodes == 1:
        return [phase]
    return [phase, _tree_inter_phase(nbytes, g)] if op == "all-reduce" else None


def hierarchical(op: Op, nbytes: float, g: GroupLinks) -> list[Phase] | None:
    """Two-level: ring inside each node, ring across nodes on 1/ranks_per_node of the data."""
    if op not in ("all-reduce", "all-gather", "reduce-scatter"):
        return None
    if g.num_nodes == 1 or g.ranks_per_node == 1:
        return None
    n, bw, lat = g.ranks_per_node, g.intra_bw_bytes_per_s, g.intra_latency_s
    if op == "all-reduce":  # reduce-scatter inside, all-reduce across, all-gather inside
        intra = [_ring_phase(o, nbytes, n, bw, lat) for o in ("reduce-scatter", "all-gather")]
    else:
        intra = [_ring_phase(op, nbytes, n, bw, lat)]
    return _two_level(op, nbytes, g, intra)


def direct(op: Op, nbytes: float, g: GroupLinks) -> list[Phase] | None:
    """Pairwise exchange for all-to-all and send/recv; NIC-bound across nodes.

    An all-to-all posts every peer's send at once (nccl-tests alltoall: one group of sends and
    receives), so its in-node and network parts run together: the time is the slower of the
    links they load (`_all_to_all_s`)."""
    if op not in ("all-to-all", "send-recv"):
        return None
    if op == "send-recv":
        if g.num_nodes == 1:
            bw = g.intra_bw_bytes_per_s
            return [Phase(nbytes, bw, g.intra_latency_s, 0.0)]
        bw = g.inter_bw_for("ring") / g.ranks_per_node  # one stream: a ring of two
        return [Phase(nbytes, bw, g.inter_latency_s, 0.0)]
    wire = nbytes * (g.size - 1) / g.size
    latency = (g.ranks_per_node - 1) * g.intra_latency_s + (g.num_nodes - 1) * g.inter_latency_s
    return [Phase(wire, wire / _all_to_all_s(nbytes, g), latency, 0.0)]


def _all_to_all_s(nbytes: float, g: GroupLinks) -> float:
    """Data time of a rank's all-to-all sends, S in all, (n - 1)/n S of it to others.

    In-node sends: (ppn - 1)/n S over the GPU's fabric link (a switch), or each pair's own
    links (a mesh, `GroupLinks.a2a_intra_bw_bytes_per_s`). Network sends: (n - ppn)/n S at the
    GPU's share of its NIC. Both at once, so the slower one sets the time; on a PCIe server
    both also cross the GPU's one x16 link, which then carries all (n - 1)/n S."""
    n, ppn = g.size, g.ranks_per_node
    intra_bw = g.a2a_intra_bw_bytes_per_s or g.intra_bw_bytes_per_s
    intra_bytes = nbytes * (ppn - 1) / n
    inter_s = 0.0
    if g.num_nodes > 1:
        inter_s = nbytes * (n - ppn) / n / (g.inter_bw_for("all_to_all") / ppn)
    if g.nic_on_intra_link:
        intra_bytes = nbytes * (n - 1) / n
    intra_s = intra_bytes / intra_bw if intra_bytes > 0 else 0.0
    return max(intra_s, inter_s)


ALGORITHMS: dict[str, Algorithm] = {
    "ring": ring,
    "tree": tree,
    "nvls": nvls,
    "hierarchical": hierarchical,
    "direct": direct,
}
