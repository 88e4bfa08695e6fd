"""GPUs that share a NIC share its bandwidth, the NIC no faster than its PCIe link, and
``--degrade inter:NODE:GPU:SCALE`` scales the NIC that GPU uses, for every GPU behind it.

Before: a degraded NIC slowed only the GPU named (DGX-1 GPU 1, behind NIC 0 with GPU 0, kept
its half NIC when ``inter:0:0:0.5`` halved NIC 0); a NIC faster than PCIe was capped only by
each GPU's own x16 link, so two GPUs pulled two x16 links' worth through one NIC's x16 link
(DGX-1 with NDR: 23.5 GB/s a GPU over PCIe 3.0, not 6.4); on a PCIe server a group's x16 cap
summed its GPUs' links (one slow link among fast ones barely counted), while its NIC share
took the slowest; and `to_graph` wired each shared NIC to its first GPU only.
"""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from topologies import (
    Cluster,
    ClusterSpec,
    Degradation,
    collective_time_s,
    load_cluster,
    load_network,
    load_server,
)

S = 2.0**30


def _quiet(server: str, *, network: str | None = None, **update: object) -> Cluster:
    """Two nodes of a catalog server with no latency anywhere (bandwidth terms alone)."""
    srv = load_server(server)
    srv = srv.model_copy(
        update={
            "launch_latency_s": 0.0,
            "intra": srv.intra.model_copy(update={"latency_s": 0.0}),
            **update,
        }
    )
    net = load_network(network or srv.default_network or "")
    net = net.model_copy(update={"link": net.link.model_copy(update={"latency_s": 0.0})})
    return Cluster(ClusterSpec(server=srv, network=net, num_nodes=2))


def _nic(c: Cluster) -> float:
    assert c.network is not None
    return c.network.link.effective_bw_bytes_per_s


def _degraded(server: str, text: str, **kw: object) -> Cluster:
    tier, node, gpu, scale = text.split(":")
    d = Degradation.model_validate(
        {"tier": tier, "node": int(node), "local_rank": int(gpu), "bw_scale": float(scale)}
    )
    return load_cluster(server, gpus=16, degradations=(d,), **kw)  # type: ignore[arg-type]


def test_two_gpus_a_nic_halve_each_gpus_inter_node_all_to_all() -> None:
    # DGX-1: 4 EDR NICs for 8 GPUs. A pair on two nodes sends S/2 across in an all-to-all at
    # half a NIC; with a NIC a GPU it gets the whole NIC: twice as fast
    shared = _quiet("dgx1-v100")
    own = _quiet("dgx1-v100", nics_per_node=8)
    nic = _nic(shared)
    assert shared.group_links([0, 8]).inter_bw_bytes_per_s == pytest.approx(nic / 2)
    assert own.group_links([0, 8]).inter_bw_bytes_per_s == pytest.approx(nic)
    t_shared = collective_time_s("all-to-all", S, [0, 8], shared)
    assert t_shared == pytest.approx((S / 2) / (nic / 2), rel=1e-12)
    assert t_shared == pytest.approx(2 * collective_time_s("all-to-all", S, [0, 8], own))
    # both GPUs behind NIC 0 in one group: the whole NIC, half each; the full node: 4 NICs
    assert shared.group_links([0, 1, 8, 9]).inter_bw_bytes_per_s == pytest.approx(nic)
    assert shared.group_links(range(16)).inter_bw_bytes_per_s == pytest.approx(4 * nic)


@pytest.mark.parametrize("named", [0, 1])
def test_a_degraded_nic_slows_every_gpu_behind_it(named: int) -> None:
    # inter:0:GPU:0.5 halves NIC 0 of node 0, which GPUs 0 and 1 share: each gets a quarter of
    # the NIC's rate whichever of the two the flag names; GPU 2 (NIC 1) is untouched
    base = load_cluster("dgx1-v100", gpus=16)
    c = _degraded("dgx1-v100", f"inter:0:{named}:0.5")
    nic = _nic(base)
    for gpu in (0, 1):
        assert c.group_links([gpu, 8 + gpu]).inter_bw_bytes_per_s == pytest.approx(nic / 4)
        before = collective_time_s("all-to-all", S, [gpu, 8 + gpu], base)
        after = collective_time_s("all-to-all", S, [gpu, 8 + gpu], c)
        assert after > 1.9 * before
    assert c.group_links([2, 10]).inter_bw_bytes_per_s == pytest.approx(nic / 2)
    assert c.group_links([0, 1, 8, 9]).inter_bw_bytes_per_s == pytest.approx(nic / 2)


def test_a_degraded_nic_in_the_graph_is_every_sharing_gpus_nic() -> None:
    g = _degraded("dgx1-v100", "inter:0:1:0.5").to_graph()
    rate = 0.5 * load_network("ib-edr").link.bw_bytes_per_s_per_dir
    for gpu in (0, 1):  # both reach NIC 0, at the degraded rate
        assert g.edges[("gpu", 0, gpu), ("nic", 0, 0)]["bw_bytes_per_s_per_dir"] == rate
    assert g.edges[("nic", 0, 0), ("leaf", 0, 0)]["bw_bytes_per_s_per_dir"] == rate
    assert not g.has_edge(("gpu", 0, 2), ("nic", 0, 0))
    assert g.has_edge(("gpu", 0, 2), ("nic", 0, 1))


@pytest.mark.parametrize(
    ("server", "network"), [("dgx1-v100", "ib-ndr"), ("pcie-h100-8gpu", "ib-xdr")]
)
def test_a_nic_is_no_faster_than_its_pcie_link_shared_by_the_gpus_behind_it(
    server: str, network: str
) -> None:
    # DGX-1: an NDR NIC (47 GB/s achieved) on PCIe 3.0 x16 (16 GB/s x 0.76): 6.08 GB/s a GPU,
    # was 23.5. H100 PCIe: an XDR NIC (94) on Gen5 x16 (48.64): 24.3 a GPU, was 47.
    c = _quiet(server, network=network)
    srv = c.server
    line, eff = srv.host_path or (srv.intra.bw_bytes_per_s_per_dir, srv.intra.efficiency)
    pcie = line * eff
    assert _nic(c) > pcie
    per_gpu = pcie * srv.nics_per_node / srv.gpus_per_node
    assert c.group_links([0, 8]).inter_bw_bytes_per_s == pytest.approx(per_gpu)
    assert c.group_links(range(16)).inter_bw_bytes_per_s == pytest.approx(8 * per_gpu)
    # a pair across nodes: S/2 over the network at that rate (a PCIe server's x16 link carries
    # nothing else for this pair)
    t = collective_time_s("all-to-all", S, [0, 8], c)
    assert t == pytest.approx((S / 2) / per_gpu, rel=1e-12)


def test_a_degraded_x16_link_bounds_its_own_gpu_and_the_group() -> None:
    # PCIe H100, default 400 GbE: half a NIC (23.5 GB/s) a GPU, under its x16 (48.64). GPU 1's
    # x16 at 1/4 (12.16) bounds GPU 1 and, as the slowest rank, a group holding it (2 ranks a
    # node: 24.32, was 47: the x16 cap summed the group's links, 1.25 x16); NIC 0 is untouched
    base = load_cluster("pcie-h100-8gpu", gpus=16)
    c = _degraded("pcie-h100-8gpu", "intra:0:1:0.25")
    x16, nic = base.server.intra.effective_bw_bytes_per_s, _nic(base)
    assert c.group_links([1, 9]).inter_bw_bytes_per_s == pytest.approx(x16 / 4)
    assert c.group_links([0, 8]).inter_bw_bytes_per_s == pytest.approx(nic / 2)
    assert c.group_links([0, 1, 8, 9]).inter_bw_bytes_per_s == pytest.approx(2 * x16 / 4)


def test_the_cli_degrades_the_shared_nic(capsys: pytest.CaptureFixture[str]) -> None:
    # 9 GPUs: node 1 holds rank 8 alone (GPU 0, NIC 0). Halving NIC 0 of node 1 by naming GPU 1,
    # which node 1 does not use, still halves rank 8's network rate
    argv = ["collective", "--op", "all-to-all", "--bytes", "1e9", "--gpus", "9"]
    argv += ["--cluster", "dgx1-v100", "--json"]
    times = []
    for extra in ([], ["--degrade", "inter:1:1:0.5"]):
        assert main([*argv, *extra]) == 0
        times.append(json.loads(capsys.readouterr().out)["time_s"])
    assert times[1] > 1.5 * times[0]
