"""A direct all-to-all's in-node and network sends run at once; the slower link sets its time.

nccl-tests alltoall posts every peer's send and receive in one group, so a rank's in-node and
network traffic flow together. Before, a PCIe server's all-to-all added the two times, as if
run one after the other: PCIe H100, 16 GPUs on XDR, 1e9 bytes took 29.6 ms, where its one x16
link carries all 15/16 S (19.3 ms) while its half a NIC carries 8/16 S (20.6 ms). On NVSwitch
servers (NIC over PCIe, peers over NVLink) the two parts overlap too. A hierarchical
all-reduce's phases are sequential (each phase's output is the next one's input), so on a PCIe
server its in-node and network phases add up (test_catalog_physics_s8).

Every latency is zeroed, so the Simple protocol's time less NCCL's base latency is the
bandwidth term alone.
"""

from __future__ import annotations

import pytest

from tests.topologies.alpha_beta import ab_t
from topologies import Cluster, ClusterSpec, Degradation, load_network, load_server
from topologies.nics import gpu_inter_bw, pcie_bw

S = 2.0**30


def _no_latency(server: str, network: str, *degr: Degradation) -> Cluster:
    srv = load_server(server)
    intra = srv.intra.model_copy(update={"latency_s": 0.0})
    srv = srv.model_copy(update={"launch_latency_s": 0.0, "nvls": None, "intra": intra})
    net = load_network(network)
    net = net.model_copy(update={"link": net.link.model_copy(update={"latency_s": 0.0})})
    return Cluster(ClusterSpec(server=srv, network=net, num_nodes=2, degradations=degr))


def _x16(c: Cluster, scale: float = 1.0) -> float:
    bw = pcie_bw(c.server)
    assert bw is not None
    return bw * scale


@pytest.mark.parametrize("network", ["ib-xdr", "ib-ndr", "roce-400gbe"])
def test_pcie_all_to_all_is_the_slower_of_its_x16_link_and_its_nic_share(network: str) -> None:
    c = _no_latency("pcie-h100-8gpu", network)
    x16, nic = _x16(c), gpu_inter_bw(c.spec, 0, 0)
    # half a NIC (2 GPUs a NIC), that NIC no faster than its x16 link
    link = c.spec.network.link.effective_bw_bytes_per_s  # type: ignore[union-attr]
    assert nic == pytest.approx(min(link, x16) / 2, rel=1e-12)
    expect = max(15 / 16 * S / x16, 8 / 16 * S / nic)
    assert ab_t("all-to-all", S, range(16), c) == pytest.approx(expect, rel=1e-12)
    # an EP group of 4 a node: 7/8 S over the x16 link, 4/8 S at its NIC share
    ep = [0, 1, 2, 3, 8, 9, 10, 11]
    expect = max(7 / 8 * S / x16, 4 / 8 * S / nic)
    assert ab_t("all-to-all", S, ep, c) == pytest.approx(expect, rel=1e-12)


def test_pcie_all_to_all_is_x16_bound_when_the_link_carries_more() -> None:
    # every x16 link at 0.6 of its rate (29 GB/s) is still faster than half an XDR NIC capped
    # at the whole link (24 GB/s), but carries 15/16 S against the NIC's 8/16 S: the link sets
    # the time (the sum was 7/16 S / link + 8/16 S / NIC share)
    c = _no_latency("pcie-h100-8gpu", "ib-xdr", Degradation(tier="intra", bw_scale=0.6))
    x16, nic = _x16(c, 0.6), gpu_inter_bw(c.spec, 0, 0)
    assert nic == pytest.approx(_x16(c) / 2, rel=1e-12)
    assert 15 / 16 / x16 > 8 / 16 / nic
    assert ab_t("all-to-all", S, range(16), c) == pytest.approx(15 / 16 * S / x16, rel=1e-12)


def test_pcie_all_to_all_inside_a_node_and_one_rank_a_node_are_as_before() -> None:
    c = _no_latency("pcie-h100-8gpu", "ib-xdr")
    assert ab_t("all-to-all", S, range(8), c) == pytest.approx(7 / 8 * S / _x16(c), rel=1e-12)
    nic = gpu_inter_bw(c.spec, 0, 0)
    assert ab_t("all-to-all", S, [0, 8], c) == pytest.approx(1 / 2 * S / nic, rel=1e-12)


@pytest.mark.parametrize(("server", "network"), [("dgx-h100", "ib-xdr"), ("dgx-a100", "ib-ndr")])
def test_nvswitch_all_to_all_overlaps_nvlink_and_the_pcie_capped_nic(
    server: str, network: str
) -> None:
    c = _no_latency(server, network)
    nvlink, nic = c.server.intra.effective_bw_bytes_per_s, gpu_inter_bw(c.spec, 0, 0)
    assert nic == pytest.approx(_x16(c), rel=1e-12)  # the NIC is faster than PCIe here
    expect = max(7 / 16 * S / nvlink, 8 / 16 * S / nic)
    assert ab_t("all-to-all", S, range(16), c) == pytest.approx(expect, rel=1e-12)
