"""Collective costs against their alpha-beta closed forms, and rank placement on 8-GPU nodes.

With every latency (launch, per step, NVLS) set to zero the pipeline term vanishes too, so the
Simple protocol's time is the bandwidth term alone: bytes each rank sends over the
per-direction bandwidth of its bottleneck link. ``S`` is the nccl-tests size (the buffer for
all-reduce, the total array for all-gather / reduce-scatter, what one rank sends for
all-to-all and send-recv).
"""

from __future__ import annotations

import pytest

from tests.topologies.alpha_beta import ab_t, ab_time_s
from topologies import (
    Cluster,
    ClusterSpec,
    TopologyError,
    collective_estimate,
    load_cluster,
    load_network,
    load_server,
)

S = 2.0**30


def _no_latency(server: str, nodes: int, network: str | None = None) -> Cluster:
    srv = load_server(server)
    srv = srv.model_copy(
        update={
            "launch_latency_s": 0.0,
            "nvls": None,
            "intra": srv.intra.model_copy(update={"latency_s": 0.0}),
        }
    )
    net = load_network(network or srv.default_network or "")
    net = net.model_copy(update={"link": net.link.model_copy(update={"latency_s": 0.0})})
    return Cluster(ClusterSpec(server=srv, network=net, num_nodes=nodes))


def _intra(c: Cluster) -> float:
    return c.server.intra.effective_bw_bytes_per_s


def _nic(c: Cluster) -> float:
    assert c.network is not None
    return c.network.link.effective_bw_bytes_per_s


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_on_one_node(n: int) -> None:
    c = _no_latency("dgx-h100", 1)
    bw = _intra(c)
    expect = {
        "all-reduce": 2 * (n - 1) / n * S / bw,
        "all-gather": (n - 1) / n * S / bw,
        "reduce-scatter": (n - 1) / n * S / bw,
        "broadcast": S / bw,
    }
    for op, t in expect.items():
        est = collective_estimate(op, S, range(n), c, algorithm="ring")  # type: ignore[arg-type]
        assert ab_time_s(est) == pytest.approx(t, rel=1e-12), op
        assert est.protocol == "simple"
    # bus bandwidth = algorithm bandwidth x 2(n-1)/n = the ring's per-rank link rate
    ar = collective_estimate("all-reduce", S, range(n), c, algorithm="ring")
    assert ar.busbw_bytes_per_s == pytest.approx(ar.algbw_bytes_per_s * 2 * (n - 1) / n)
    assert ar.busbw_bytes_per_s * ar.time_s / ab_time_s(ar) == pytest.approx(bw)


def test_flat_ring_across_nodes_is_bound_by_the_node_nics() -> None:
    # 2 nodes x 8: every ring crosses each node's NICs once; 8 NICs carry what 1 GPU sends
    c = _no_latency("dgx-h100", 2, "ib-hdr")
    t = ab_t("all-reduce", S, range(16), c, algorithm="ring")
    assert t == pytest.approx(2 * 15 / 16 * S / min(_intra(c), 8 * _nic(c)), rel=1e-12)
    one = ab_t("all-gather", S, [0, 8], c, algorithm="ring")  # one GPU per node
    assert one == pytest.approx(S / 2 / _nic(c), rel=1e-12)


@pytest.mark.parametrize(("nodes", "network"), [(2, "ib-ndr"), (2, "ib-hdr"), (4, "ib-hdr")])
def test_hierarchical_all_reduce(nodes: int, network: str) -> None:
    # intra reduce-scatter + all-gather of S over 8 GPUs; across nodes an all-reduce of S/8 per
    # GPU on its own NIC (8 rails); NVLink and the NICs run at once
    c = _no_latency("dgx-h100", nodes, network)
    k = nodes
    intra_s = 2 * 7 / 8 * S / _intra(c)
    inter_s = 2 * (k - 1) / k * (S / 8) / _nic(c)
    t = ab_t("all-reduce", S, range(8 * k), c, algorithm="hierarchical")
    assert t == pytest.approx(max(intra_s, inter_s), rel=1e-12)
    ag = ab_t("all-gather", S, range(8 * k), c, algorithm="hierarchical")
    assert ag == pytest.approx(max(7 / 8 * S / _intra(c), (k - 1) / k * S / 8 / _nic(c)))


def test_hierarchical_on_pcie_adds_the_nic_traffic_to_the_x16_link() -> None:
    c = _no_latency("pcie-h100-8gpu", 2)
    nic_per_gpu = c.server.nics_per_node / c.server.gpus_per_node  # 4 NICs, 8 GPUs
    intra_s = 2 * 7 / 8 * S / _intra(c)
    inter_s = 2 * 1 / 2 * (S / 8) / (nic_per_gpu * _nic(c))
    t = ab_t("all-reduce", S, range(16), c, algorithm="hierarchical")
    assert t == pytest.approx(intra_s + inter_s, rel=1e-12)


def test_all_to_all() -> None:
    one = _no_latency("dgx-h100", 1)
    assert ab_t("all-to-all", S, range(8), one) == pytest.approx(7 / 8 * S / _intra(one), rel=1e-12)
    c = _no_latency("dgx-h100", 4)
    # one GPU per node: a full-bisection network, (n-1)/n S through each GPU's NIC
    assert ab_t("all-to-all", S, [0, 8, 16, 24], c) == pytest.approx(3 / 4 * S / _nic(c), rel=1e-12)
    # 2 nodes x 8: 7/16 of S over NVLink beside 8/16 of S over the GPU's own NIC
    t = ab_t("all-to-all", S, range(16), c)
    assert t == pytest.approx(max(7 / 16 * S / _intra(c), 8 / 16 * S / _nic(c)), rel=1e-12)


@pytest.mark.parametrize("server", ["dgx-h100", "pcie-h100-8gpu"])
def test_pipeline_send_same_node_and_across(server: str) -> None:
    c = _no_latency(server, 2)
    nic_per_gpu = c.server.nics_per_node / c.server.gpus_per_node
    inside = ab_t("send-recv", S, [3, 4], c)
    across = ab_t("send-recv", S, [3, 11], c)
    assert inside == pytest.approx(S / _intra(c), rel=1e-12)
    assert across == pytest.approx(S / (nic_per_gpu * _nic(c)), rel=1e-12)
    assert inside < across
    assert ab_t("send-recv", S, [5], c) == 0.0


def test_group_spanning_two_leaf_groups_pays_the_oversubscription() -> None:
    # 64 nodes, 32 per leaf group, 2:1 leaf down:up: a pair under one leaf keeps its NIC rate;
    # a pair under two leaves crosses the spine (as to_graph wires it) at half of it. The PP
    # hop of a 512-GPU job with tp*cp*dp = 256 is such a pair (nodes 0 and 32): every node of
    # the stage sends across at once. A ring's share is per leaf (topologies/spine.py): 33
    # nodes put one under the second leaf, whose one stream is all its traffic.
    c = load_cluster("dgx-h100", gpus=8 * 64, oversubscription=2.0)
    flat = load_cluster("dgx-h100", gpus=8 * 64)
    nic = flat.group_links([0, 8]).inter_bw_bytes_per_s
    assert c.group_links([0, 8]).inter_bw_for("ring") == nic  # nodes 0, 1: one leaf group
    assert c.group_links([8 * 31, 8 * 32]).inter_bw_for("ring") == pytest.approx(nic / 2)
    assert c.group_links([0, 8 * 32]).inter_bw_for("ring") == pytest.approx(nic / 2)
    assert flat.group_links([0, 8 * 32]).inter_bw_for("ring") == nic
    assert c.group_links(range(0, 8 * 33, 8)).inter_bw_for("ring") == pytest.approx(nic / 2)
    assert c.group_links(range(0, 8 * 64, 8)).inter_bw_for("ring") == nic  # 32 + 32: 1/32 out
    g = c.to_graph()  # the spine the pair crosses is the one group_links divides by
    assert ("leaf", 0, 0) in g and ("leaf", 0, 1) in g
    assert g.edges[("leaf", 0, 1), ("spine", 0)]["bw_bytes_per_s_per_dir"] == pytest.approx(
        32 * c.spec.network.link.bw_bytes_per_s_per_dir / 2  # type: ignore[union-attr]
    )
    slow = ab_t("send-recv", S, [0, 8 * 32], c)
    fast = ab_t("send-recv", S, [0, 8 * 31], c)
    assert slow > fast


def test_nodes_without_a_network_are_refused() -> None:
    # was accepted, then all-to-all over both nodes divided by a zero NIC bandwidth
    # (ZeroDivisionError) and the ring took infinite time
    srv = load_server("dgx-h100")
    with pytest.raises(TopologyError, match="network"):
        Cluster(ClusterSpec(server=srv, network=None, num_nodes=2))
    no_nic = srv.model_copy(update={"nics_per_node": 0})
    with pytest.raises(TopologyError, match="NIC"):
        Cluster(ClusterSpec(server=no_nic, network=load_network("ib-ndr"), num_nodes=2))
    assert Cluster(ClusterSpec(server=srv, network=None, num_nodes=1)).world_size == 8


GRID = [(tp, dp, pp) for tp in (1, 2, 4, 8, 16) for dp in (1, 2, 4) for pp in (1, 2, 4)]


@pytest.mark.parametrize(("tp", "dp", "pp"), GRID)
def test_megatron_groups_that_cross_nodes(tp: int, dp: int, pp: int) -> None:
    # tp innermost (stride 1), then dp (stride tp), then pp (stride tp*dp): on 8-GPU nodes a
    # group of power-of-two size and stride spans one node per member once stride >= 8, else
    # size*stride/8 nodes (at least one)
    c = load_cluster("dgx-h100", gpus=max(8, tp * dp * pp))
    groups = c.placement(tp=tp, dp=dp, pp=pp)
    for dim, size, stride in (("tp", tp, 1), ("dp", dp, tp), ("pp", pp, tp * dp)):
        assert len(groups[dim]) == tp * dp * pp // size
        for group in groups[dim]:
            nodes = {c.node_of(r) for r in group}
            assert len(nodes) == (size if stride >= 8 else max(1, size * stride // 8))
            links = c.group_links(group)
            if len(nodes) == 1:  # a group inside a node never touches the network
                assert c.tier_of(group) == c.server.intra
                assert links.num_nodes == 1 and links.inter_bw_bytes_per_s == 0.0
                if size > 1:
                    nic = c.network
                    nets = [c.spec.model_copy(update={"network": nic.model_copy(update={
                        "link": nic.link.model_copy(update={"bw_bytes_per_s_per_dir": b})})})
                        for b in (1e9, 1e12)] if nic else []  # fmt: skip
                    times = {ab_t("all-reduce", S, group, Cluster(s)) for s in nets}
                    assert len(times) <= 1
            else:
                assert c.tier_of(group) == c.network.link  # type: ignore[union-attr]


@pytest.mark.parametrize("network", ["roce-800gbe", "ib-xdr"])
def test_pcie_gpu_cannot_reach_the_network_faster_than_its_x16_link(network: str) -> None:
    # An L40S reaches its NIC (and its peers) over one PCIe Gen4 x16 link, 32 GB/s each way.
    # Half an 800 Gb/s NIC per GPU (47 GB/s) was taken as is, so a pair on two nodes ran 2x
    # faster than the same pair inside one node. The NIC share is capped at the x16 rate; and
    # the NIC's own x16 link, which the two GPUs behind it share, caps the NIC: half of x16 each
    # (it was a whole x16 each, two GPUs pulling 2 x16 through one NIC's x16 link).
    c = load_cluster("pcie-l40s-8gpu", gpus=16, network=network)
    x16 = c.server.intra.effective_bw_bytes_per_s
    assert c.group_links([0, 8]).inter_bw_bytes_per_s == pytest.approx(x16 / 2)
    assert c.group_links(range(16)).inter_bw_bytes_per_s == pytest.approx(8 * x16 / 2)
    for op in ("send-recv", "all-reduce", "all-gather", "all-to-all"):
        assert ab_t(op, S, [0, 1], c) <= ab_t(op, S, [0, 8], c), op
    # slower NICs than the x16 link keep their own rate (the catalog's default networks)
    own = load_cluster("pcie-l40s-8gpu", gpus=16)
    nic = own.network.link.effective_bw_bytes_per_s  # type: ignore[union-attr]
    assert nic / 2 < x16
    assert own.group_links([0, 8]).inter_bw_bytes_per_s == pytest.approx(nic / 2)
