"""`Cluster.to_graph`'s GPU-to-NIC edges (tier ``pcie``) are no faster than the GPU's x16 link.

The bandwidth model (`topologies.nics.gpu_inter_bw`) serves a GPU's NIC no faster than the
GPU's PCIe x16 link; the graph gave the edge the NIC's rate: an XDR NIC's 100 GB/s a direction
on a Gen5 x16 link of 64. Now the edge is the lesser of the NIC (with its degradation) and the
x16 link (on a PCIe server with the GPU's ``intra`` degradation: it is that link), at line
rate, as every edge of the graph is.
"""

from __future__ import annotations

import math

import networkx as nx
import pytest

from topologies import Cluster, Degradation, ServerSpec, load_cluster, load_network
from topologies.nics import gpu_inter_bw

GEN5_X16, GEN3_X16 = 6.4e10, 1.6e10  # line rates, one direction


def _nic_edge(server: str, network: str, *degr: Degradation) -> float:
    g = load_cluster(server, gpus=16, network=network, degradations=degr).to_graph()
    return float(g.edges[("gpu", 0, 0), ("nic", 0, 0)]["bw_bytes_per_s_per_dir"])


def _port(network: str) -> float:
    return load_network(network).link.bw_bytes_per_s_per_dir


@pytest.mark.parametrize(
    ("server", "network", "x16"),
    [
        ("pcie-h100-8gpu", "ib-xdr", GEN5_X16),
        ("pcie-h100-8gpu", "ib-ndr", GEN5_X16),
        ("dgx-h100", "ib-xdr", GEN5_X16),
        ("dgx-h100", "ib-ndr", GEN5_X16),
        ("dgx1-v100", "ib-ndr", GEN3_X16),  # its host path
        ("dgx1-v100", "ib-edr", GEN3_X16),
    ],
)
def test_the_gpu_nic_edge_is_the_lesser_of_nic_and_x16(
    server: str, network: str, x16: float
) -> None:
    assert _nic_edge(server, network) == min(_port(network), x16)


def test_xdr_on_gen5_is_capped_at_the_x16_link() -> None:
    assert _port("ib-xdr") > GEN5_X16
    assert _nic_edge("dgx-h100", "ib-xdr") == GEN5_X16


def test_no_pcie_on_file_leaves_the_nic_rate() -> None:
    assert load_cluster("gb200-nvl72", gpus=72).server.pcie is None
    g = load_cluster("gb200-nvl72", gpus=144, network="ib-xdr").to_graph()
    edge = g.edges[("gpu", 0, 0), ("nic", 0, 0)]["bw_bytes_per_s_per_dir"]
    assert edge == _port("ib-xdr")


def test_degradations_scale_the_edge_as_the_model_does() -> None:
    # a PCIe server's intra link is the x16 link: it caps the NIC path too
    half_x16 = Degradation(tier="intra", node=0, local_rank=0, bw_scale=0.5)
    assert _nic_edge("pcie-h100-8gpu", "ib-ndr", half_x16) == GEN5_X16 / 2
    # an NVSwitch server's intra link is NVLink: the NIC path keeps its x16 cap
    assert _nic_edge("dgx-h100", "ib-xdr", half_x16) == GEN5_X16
    # a NIC at a quarter of XDR (25 GB/s) is now the slower
    slow_nic = Degradation(tier="inter", node=0, local_rank=0, bw_scale=0.25)
    assert _nic_edge("pcie-h100-8gpu", "ib-xdr", slow_nic) == _port("ib-xdr") * 0.25


def _node_to_network_line_rate(server: str, network: str) -> float:
    """Maximum flow, line rate, from every GPU of node 0 into the network (its leaves)."""
    g = load_cluster(server, gpus=16, network=network).to_graph()
    flow = nx.DiGraph()
    for a, b, d in g.edges(data=True):
        flow.add_edge(a, b, capacity=d["bw_bytes_per_s_per_dir"])
        flow.add_edge(b, a, capacity=d["bw_bytes_per_s_per_dir"])
    for n in list(flow.nodes):
        if n[0] == "gpu" and n[1] == 0:
            flow.add_edge("src", n, capacity=math.inf)
        elif n[0] == "leaf":
            flow.add_edge(n, "dst", capacity=math.inf)
    return float(nx.maximum_flow_value(flow, "src", "dst"))


@pytest.mark.parametrize(
    ("server", "network", "x16"),
    [
        ("pcie-h100-8gpu", "ib-xdr", GEN5_X16),  # 2 GPUs a NIC: 2 x16 links into it
        ("dgx1-v100", "ib-ndr", GEN3_X16),
        ("pcie-h100-8gpu", "roce-400gbe", GEN5_X16),  # the port is the slower
        ("dgx-h100", "ib-xdr", GEN5_X16),  # a NIC a GPU
    ],
)
def test_a_shared_nic_sends_no_more_than_its_own_x16_link(
    server: str, network: str, x16: float
) -> None:
    # as `nics.gpu_inter_bw`: a NIC at the lesser of its port and its own x16 link, which the
    # GPUs behind it share; the graph let two GPUs' x16 links fill an XDR port past it
    nics = load_cluster(server, gpus=16, network=network).server.nics_per_node
    expected = nics * min(_port(network), x16)
    assert _node_to_network_line_rate(server, network) == pytest.approx(expected)


def test_a_gpu_with_two_nics_sends_no_more_than_its_x16_link() -> None:
    # 16 NICs on 8 GPUs: each GPU reaches two NICs; `nics.gpu_inter_bw` caps the two together
    # at the GPU's one x16 link (2 x 47 GB/s of NDR, effective, against 48.6), the graph let
    # each NIC edge take the whole link (2 x 50 GB/s line rate through a 64 GB/s link)
    base = load_cluster("dgx-h100", gpus=16)
    server = ServerSpec.model_validate({**base.server.model_dump(), "nics_per_node": 16})
    cluster = Cluster(base.spec.model_copy(update={"server": server}))
    g = cluster.to_graph()
    both = sum(
        g.edges[("gpu", 0, 0), nic]["bw_bytes_per_s_per_dir"]
        for nic in g.neighbors(("gpu", 0, 0))
        if nic[0] == "nic"
    )
    assert sum(1 for n in g.neighbors(("gpu", 0, 0)) if n[0] == "nic") == 2
    assert both == pytest.approx(min(2 * _port("ib-ndr"), GEN5_X16))
    link = cluster.server.pcie
    assert link is not None
    model = gpu_inter_bw(cluster.spec, 0, 0)
    assert model == pytest.approx(
        min(2 * base.network.link.effective_bw_bytes_per_s, link.effective_bw_bytes_per_s)
    )
