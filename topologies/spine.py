"""Which collective traffic crosses an oversubscribed leaf-spine tier, given rank placement.

Nodes hang under leaf groups of ``nodes_per_leaf`` (node // nodes_per_leaf, as
`Cluster.to_graph` wires them); a leaf's uplinks carry ``1 / oversubscription`` of what its
nodes' NICs can send. Only the traffic that leaves a leaf is slowed, and only when it exceeds
the uplinks: with every node under the leaf busy with a group placed like this one (the
simulator prices one group of many symmetric ones), a leaf sends ``share`` of its nodes' NIC
traffic up, so the network term is slowed by ``max(1, share x oversubscription)``:

* ring (flat, or the ring among nodes of a two-level algorithm): nodes in rank order; a leaf
  holding ``k`` of the group's nodes sends one of their ``k`` streams to the next leaf, so
  ``share = 1 / k`` (0 when the group stays in one leaf: a ring is not slowed there).
* tree (NCCL's double binary tree over the group's nodes in rank order): per leaf, the tree
  edges with one end outside over all edge ends inside.
* all-to-all: every node sends to every other rank alike, so a node's share is the group's
  ranks outside its leaf over those outside its node (1 when no two nodes share a leaf: then
  the full ratio).
* point to point (`send_share`): a two-rank group is one of many pairs that send at once: a
  pipeline's stage boundaries (`shift_share`), a step of every context-parallel ring
  (`ring_step_share`). With that pair alone as the pattern one crossing leaves would pay the
  full ratio, though in a leaf of several stages most pairs stay under it; the share is the
  leaf's uplink demand over what all its nodes' NICs could send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class SpineSlowdown:
    """Factors (>= 1) dividing the network bandwidth, per traffic pattern."""

    ring: float = 1.0
    tree: float = 1.0
    all_to_all: float = 1.0


def spine_slowdown(
    ranks_per_node: Mapping[int, int], nodes_per_leaf: int, oversubscription: float
) -> SpineSlowdown:
    """Slowdowns of a group with ``ranks_per_node`` (node -> ranks there) on this fat tree."""
    if oversubscription <= 1 or len({n // nodes_per_leaf for n in ranks_per_node}) < 2:
        return SpineSlowdown()
    nodes = sorted(ranks_per_node)
    leaf = [n // nodes_per_leaf for n in nodes]
    return SpineSlowdown(
        ring=slowdown(ring_share(leaf), oversubscription),
        tree=slowdown(tree_share(leaf), oversubscription),
        all_to_all=slowdown(all_to_all_share(ranks_per_node, nodes_per_leaf), oversubscription),
    )


def slowdown(share: float, oversubscription: float) -> float:
    """The factor dividing network bandwidth when ``share`` of a leaf's NIC traffic goes up."""
    return max(1.0, share * oversubscription)


def ring_share(leaf: Sequence[int]) -> float:
    """Largest share of a leaf's ring traffic that leaves it (``leaf[i]``: leaf of the i-th
    node in ring order)."""
    n = len(leaf)
    out: dict[int, int] = {}
    held: dict[int, int] = {}
    for i, lf in enumerate(leaf):
        held[lf] = held.get(lf, 0) + 1
        if leaf[(i + 1) % n] != lf:
            out[lf] = out.get(lf, 0) + 1
    return max(out.get(lf, 0) / k for lf, k in held.items())


def _btree_parents(n: int) -> list[int]:
    """NCCL's binary tree (ncclGetBtree) over positions 0..n-1: each position's parent, -1 for
    the root."""
    parents = [-1] * n
    for r in range(1, n):
        bit = r & -r
        up = (r ^ bit) | (bit << 1)
        parents[r] = up if up < n else r ^ bit
    return parents


def tree_share(leaf: Sequence[int]) -> float:
    """Largest share of a leaf's tree traffic that leaves it: both trees of NCCL's double
    binary tree (the second mirrored, n - 1 - r), every edge carrying the same bytes."""
    n = len(leaf)
    ends: dict[int, int] = {}
    cross: dict[int, int] = {}
    for mirror in (False, True):
        for r, p in enumerate(_btree_parents(n)):
            if p < 0:
                continue
            a, b = (n - 1 - r, n - 1 - p) if mirror else (r, p)
            for x, y in ((a, b), (b, a)):
                ends[leaf[x]] = ends.get(leaf[x], 0) + 1
                if leaf[x] != leaf[y]:
                    cross[leaf[x]] = cross.get(leaf[x], 0) + 1
    return max(cross.get(lf, 0) / e for lf, e in ends.items())


def all_to_all_share(ranks_per_node: Mapping[int, int], nodes_per_leaf: int) -> float:
    """Largest share of a node's all-to-all network traffic that leaves its leaf."""
    total = sum(ranks_per_node.values())
    in_leaf: dict[int, int] = {}
    for node, k in ranks_per_node.items():
        in_leaf[node // nodes_per_leaf] = in_leaf.get(node // nodes_per_leaf, 0) + k
    shares = [
        (total - in_leaf[node // nodes_per_leaf]) / (total - k)
        for node, k in ranks_per_node.items()
        if total > k
    ]
    return max(shares, default=0.0)


def shift_share(
    world: int, stride: int, wrap: bool, *, gpus_per_node: int, nodes_per_leaf: int
) -> float:
    """`send_share` of every rank ``r`` of ranks ``0 .. world - 1`` that has a rank ``stride``
    ahead sending to it and back, all at once: a pipeline's stage boundaries (``stride`` ranks
    a stage; ``wrap``, interleaved schedules, adds the last stage's sends to the first), or the
    tied embedding's all-reduce (``stride`` = all stages but one)."""
    r = np.arange(world if wrap else world - stride, dtype=np.int64)
    ahead = (r + stride) % world
    src, dst = np.concatenate([r, ahead]), np.concatenate([ahead, r])
    return send_share(src, dst, world, gpus_per_node=gpus_per_node, nodes_per_leaf=nodes_per_leaf)


def ring_step_share(
    world: int, step: int, size: int, *, gpus_per_node: int, nodes_per_leaf: int
) -> float:
    """`send_share` of one step of every ring of ``size`` ranks ``step`` apart (in blocks of
    ``step x size`` ranks, as Megatron places context-parallel groups) at once: each rank
    sends to the next rank of its ring."""
    r = np.arange(world, dtype=np.int64)
    pos = (r // step) % size
    dst = r + np.where(pos < size - 1, step, -step * (size - 1))
    return send_share(r, dst, world, gpus_per_node=gpus_per_node, nodes_per_leaf=nodes_per_leaf)


def send_share(
    src: npt.NDArray[np.int64],
    dst: npt.NDArray[np.int64],
    world: int,
    *,
    gpus_per_node: int,
    nodes_per_leaf: int,
) -> float:
    """Largest share of a leaf's uplink capacity that point-to-point sends ``src[i] ->
    dst[i]`` among ranks ``0 .. world - 1`` (node-major), all at once, demand. A rank's network
    sends share its NIC; sends inside a node use none. A leaf's uplinks are sized for all its
    ``nodes_per_leaf`` nodes, busy or not."""
    net = src // gpus_per_node != dst // gpus_per_node
    per_leaf = gpus_per_node * nodes_per_leaf
    leaves = src // per_leaf != dst // per_leaf
    sends = np.bincount(src[net], minlength=world)
    out = np.bincount(src[leaves], minlength=world)
    frac = np.divide(out, sends, out=np.zeros(world), where=sends > 0)
    demand = np.bincount(np.arange(world) // per_leaf, weights=frac)
    return float(demand.max(initial=0.0)) / per_leaf


def p2p_slowdown(share: float, oversubscription: float) -> SpineSlowdown:
    """A point-to-point pattern's slowdowns (`send_share`): every algorithm alike, as its
    pairs send point to point."""
    f = slowdown(share, oversubscription)
    return SpineSlowdown(ring=f, tree=f, all_to_all=f)
