"""A cluster: rank placement, the link tier a rank group spans, and its physical graph.

Ranks are numbered node-major: rank r lives on node ``r // gpus_per_node``. Parallel groups
follow Megatron order by default (tp innermost, then dp, then pp).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import networkx as nx

from topologies.mesh import all_to_all_share, group_share
from topologies.nics import gpu_inter_bw, link_scale, nic_of, nic_scale, pcie_line_bw
from topologies.spec import ClusterSpec, LinkTier, NVLSSpec, TierKind, TopologyError
from topologies.spine import SpineSlowdown, p2p_slowdown, spine_slowdown

MEGATRON_ORDER: tuple[str, ...] = ("tp", "dp", "pp")


@dataclass(frozen=True)
class GroupLinks:
    """What one rank group sees of the cluster: the input of every collective cost model.

    Bandwidths are effective (line rate x efficiency x degradation), bytes/s per direction;
    ``inter_bw_bytes_per_s`` is per node: the group's ranks there times the slowest one's
    `topologies.nics.gpu_inter_bw` (its share of a NIC that GPUs share, the NIC no faster
    than its PCIe link, the GPU no faster than its own).
    ``nic_on_intra_link``: a GPU reaches its NIC over the same link it reaches its peers by
    (a PCIe-only server: one x16 link carries both): a hierarchical algorithm's in-node and
    network phases, one after the other, add up; an all-to-all's, sent at once, load the link
    with both.
    ``spine``: how much an oversubscribed leaf-spine tier slows each traffic pattern of this
    group (ring, tree, all-to-all), given where its nodes sit; ``inter_bw_bytes_per_s`` is
    before it (`inter_bw_for` after).
    ``a2a_intra_bw_bytes_per_s``: the rate at which a rank's in-node all-to-all traffic drains
    where that is not the ring rate (a mesh whose pairs differ in links, or have none:
    `topologies.mesh.all_to_all_share`); None on a switch or a PCIe fabric, where the GPU's one
    link carries both.
    """

    size: int
    num_nodes: int
    ranks_per_node: int
    intra_bw_bytes_per_s: float
    intra_line_bw_bytes_per_s: float
    intra_latency_s: float
    inter_bw_bytes_per_s: float
    inter_latency_s: float
    launch_latency_s: float
    nvls: NVLSSpec | None
    nic_on_intra_link: bool = False
    a2a_intra_bw_bytes_per_s: float | None = None
    spine: SpineSlowdown = field(default_factory=SpineSlowdown)

    def inter_bw_for(self, pattern: Literal["ring", "tree", "all_to_all"]) -> float:
        """``inter_bw_bytes_per_s`` less what an oversubscribed spine takes from ``pattern``'s
        traffic (`topologies.spine`)."""
        return self.inter_bw_bytes_per_s / getattr(self.spine, pattern)


class Cluster:
    """Nodes x GPUs of one server type, joined by a rail-optimised fat tree."""

    def __init__(self, spec: ClusterSpec) -> None:
        if spec.num_nodes > 1 and (spec.network is None or spec.server.nics_per_node == 0):
            raise TopologyError(
                f"{spec.num_nodes} nodes of {spec.server.id} need a network and at least one NIC "
                "per node to talk; give a network and nics_per_node >= 1, or one node"
            )
        self.spec = spec
        self.server = spec.server
        self.network = spec.network
        # group_links is a pure function of the ranks; a sweep asks for the same groups over
        # and over (every layout's DP and TP groups), and each answer walks every rank.
        self._links: dict[tuple[int, ...], GroupLinks] = {}
        self._p2p: dict[tuple[str | int, ...], SpineSlowdown] = {}

    @property
    def world_size(self) -> int:
        """Number of GPUs."""
        return self.spec.world_size

    def node_of(self, rank: int) -> int:
        """The node holding a rank."""
        self._check_rank(rank)
        return rank // self.server.gpus_per_node

    def local_rank_of(self, rank: int) -> int:
        """The rank's GPU index inside its node."""
        self._check_rank(rank)
        return rank % self.server.gpus_per_node

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise TopologyError(
                f"rank {rank} is outside this cluster of {self.world_size} GPUs; "
                f"use ranks 0..{self.world_size - 1} or a larger --gpus"
            )

    def placement(
        self, *, tp: int, dp: int, pp: int, order: Sequence[str] = MEGATRON_ORDER
    ) -> dict[str, list[tuple[int, ...]]]:
        """Rank groups per parallel dimension; ``order`` lists dimensions innermost first."""
        sizes = {"tp": tp, "dp": dp, "pp": pp}
        if sorted(order) != sorted(sizes):
            raise TopologyError(f"order must name tp, dp and pp once each, got {list(order)}")
        if tp * dp * pp > self.world_size or min(sizes.values()) < 1:
            raise TopologyError(
                f"tp*dp*pp = {tp * dp * pp} must be between 1 and the {self.world_size} GPUs"
            )
        cumulative = itertools.accumulate([sizes[d] for d in order[:-1]], operator.mul, initial=1)
        strides = dict(zip(order, cumulative, strict=True))
        groups: dict[str, list[tuple[int, ...]]] = {}
        for dim in order:
            others = [d for d in order if d != dim]
            found = []
            for idx in itertools.product(*(range(sizes[d]) for d in others)):
                base = sum(i * strides[d] for i, d in zip(idx, others, strict=True))
                found.append(tuple(base + k * strides[dim] for k in range(sizes[dim])))
            groups[dim] = sorted(found)
        return groups

    def p2p_spine(self, share_of: Callable[..., float], *pattern: int) -> SpineSlowdown:
        """Spine slowdowns of a pair that sends while the whole ``pattern`` does (ranks
        ``0 .. world - 1``; `topologies.spine.shift_share`: a pipeline's stage boundaries,
        `ring_step_share`: a step of every context-parallel ring), not those of the one pair
        that `group_links` would see; computed once per pattern, nothing to slow at 1:1."""
        key: tuple[str | int, ...] = (share_of.__name__, *pattern)
        if key not in self._p2p:
            over, share = self.spec.oversubscription, 0.0
            if over > 1:
                per_node, per_leaf = self.server.gpus_per_node, self.spec.nodes_per_leaf
                share = share_of(*pattern, gpus_per_node=per_node, nodes_per_leaf=per_leaf)
            self._p2p[key] = p2p_slowdown(share, over)
        return self._p2p[key]

    def tier_of(self, ranks: Sequence[int]) -> LinkTier:
        """The slowest link tier a rank group spans: the node fabric or the network."""
        nodes = {self.node_of(r) for r in ranks}
        if len(nodes) > 1 and self.network is not None:
            return self.network.link
        return self.server.intra

    def _scale(self, tier: TierKind, node: int, local: int) -> float:
        return link_scale(self.spec, tier, node, local)

    def group_links(self, ranks: Sequence[int]) -> GroupLinks:
        """Effective bandwidths and latencies of a rank group (see `GroupLinks`)."""
        key = tuple(ranks)
        if key not in self._links:
            self._links[key] = self._group_links(key)
        return self._links[key]

    def _group_links(self, ranks: tuple[int, ...]) -> GroupLinks:
        if len(set(ranks)) != len(ranks) or not ranks:
            raise TopologyError("a rank group needs at least one rank and no repeated ranks")
        per_node: dict[int, list[int]] = {}
        for r in ranks:
            per_node.setdefault(self.node_of(r), []).append(self.local_rank_of(r))
        ppn = max(len(v) for v in per_node.values())
        intra = self.server.intra
        degraded = min(self._scale("intra", n, lr) for n, ls in per_node.items() for lr in ls)
        intra_scale, a2a_bw = degraded, None
        if self.server.fabric == "mesh":  # rings use only the links among the group's GPUs
            intra_scale *= group_share(self.server, per_node.values())
            share = all_to_all_share(self.server, per_node.values(), ppn)
            a2a_bw = intra.effective_bw_bytes_per_s * degraded * share
        return GroupLinks(
            size=len(ranks),
            num_nodes=len(per_node),
            ranks_per_node=ppn,
            intra_bw_bytes_per_s=intra.effective_bw_bytes_per_s * intra_scale,
            intra_line_bw_bytes_per_s=intra.bw_bytes_per_s_per_dir * intra_scale,
            intra_latency_s=intra.latency_s,
            inter_bw_bytes_per_s=self._inter_bw(per_node),
            inter_latency_s=self.network.link.latency_s if self.network else 0.0,
            launch_latency_s=self.server.launch_latency_s,
            nvls=self.server.nvls if self.server.fabric == "nvswitch" else None,
            nic_on_intra_link=self.server.fabric == "pcie",
            a2a_intra_bw_bytes_per_s=a2a_bw,
            spine=spine_slowdown(
                {n: len(ls) for n, ls in per_node.items()},
                self.spec.nodes_per_leaf,
                self.spec.oversubscription,
            ),
        )

    def _inter_bw(self, per_node: dict[int, list[int]]) -> float:
        """A group's network bandwidth per node: its ranks there times the slowest one's
        (`topologies.nics.gpu_inter_bw`), the least over its nodes."""
        if len(per_node) < 2 or self.network is None:
            return 0.0
        return min(
            len(ls) * min(gpu_inter_bw(self.spec, n, lr) for lr in ls) for n, ls in per_node.items()
        )

    def to_graph(self) -> nx.Graph:
        """The physical topology: GPUs, node fabric, NICs, rail leaves and spines.

        Nodes are tuples (``("gpu", node, i)``, ``("nvswitch", node)``, ``("nic", node, i)``,
        ``("leaf", rail, group)``, ``("spine", rail)``) with a ``kind`` attribute; edges carry
        ``bw_bytes_per_s_per_dir`` (line rate) and ``tier``. A GPU's edge to its NIC (``pcie``)
        is no faster than the GPU's x16 link, and a NIC's edge to its leaf no faster than the
        NIC's own x16 link (as fast, `topologies.nics`; shared by the GPUs behind the NIC),
        where the server file gives one.
        """
        g = nx.Graph()
        for node in range(self.spec.num_nodes):
            self._add_node_fabric(g, node)
            self._add_nics(g, node)
        return g

    def _add_node_fabric(self, g: nx.Graph, node: int) -> None:
        srv = self.server
        per_link = srv.intra.bw_bytes_per_s_per_dir / srv.links_per_gpu
        gpus = [("gpu", node, i) for i in range(srv.gpus_per_node)]
        for i, gpu in enumerate(gpus):
            g.add_node(gpu, kind="gpu", gpu=srv.gpu)
            if srv.fabric != "mesh":
                hub = (srv.fabric, node)
                g.add_node(hub, kind=srv.fabric)
                bw = srv.intra.bw_bytes_per_s_per_dir * self._scale("intra", node, i)
                g.add_edge(gpu, hub, bw_bytes_per_s_per_dir=bw, tier="intra")
        if srv.fabric == "mesh":  # one edge per pair: all the links joining it
            for (a, b), links in srv.pair_links().items():
                scale = min(self._scale("intra", node, a), self._scale("intra", node, b))
                bw = per_link * links * scale
                g.add_edge(gpus[a], gpus[b], bw_bytes_per_s_per_dir=bw, tier="intra")

    def _add_nics(self, g: nx.Graph, node: int) -> None:
        srv, net = self.server, self.network
        if net is None or srv.nics_per_node == 0:
            return
        leaf_group = node // self.spec.nodes_per_leaf
        n_groups = -(-self.spec.num_nodes // self.spec.nodes_per_leaf)
        for rail in range(srv.nics_per_node):
            nic = ("nic", node, rail)
            local = rail * srv.gpus_per_node // srv.nics_per_node
            bw = net.link.bw_bytes_per_s_per_dir * nic_scale(self.spec, node, local)
            g.add_node(nic, kind="nic", network=net.id)
            for gpu in range(srv.gpus_per_node):  # every GPU sharing the NIC reaches it
                if nic_of(srv, gpu) == nic_of(srv, local):
                    pcie = self._pcie_path_bw(node, gpu, bw)
                    g.add_edge(("gpu", node, gpu), nic, bw_bytes_per_s_per_dir=pcie, tier="pcie")
            leaf = ("leaf", rail, leaf_group)
            g.add_node(leaf, kind="leaf")
            port = min(bw, pcie_line_bw(srv) or bw)  # fed by its own x16 link (`nics`)
            g.add_edge(nic, leaf, bw_bytes_per_s_per_dir=port, tier="inter")
            if n_groups > 1:
                up = net.link.bw_bytes_per_s_per_dir * self.spec.nodes_per_leaf
                g.add_node(("spine", rail), kind="spine")
                g.add_edge(
                    leaf,
                    ("spine", rail),
                    bw_bytes_per_s_per_dir=up / self.spec.oversubscription,
                    tier="inter",
                )

    def _pcie_path_bw(self, node: int, gpu: int, nic_bw: float) -> float:
        """A GPU's PCIe path to its NIC, line rate: the NIC's rate, no faster than the GPU's x16
        link (on a PCIe server scaled by its ``intra`` degradation: it is that link), which a
        GPU with several NICs splits evenly over them, as `topologies.nics.gpu_inter_bw` caps
        the GPU's effective rate."""
        srv = self.server
        pcie = pcie_line_bw(srv)
        if pcie is None:
            return nic_bw
        own = self._scale("intra", node, gpu) if srv.fabric == "pcie" else 1.0
        return min(nic_bw, pcie * own / max(1, srv.nics_per_node // srv.gpus_per_node))
