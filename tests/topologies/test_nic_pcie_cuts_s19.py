"""A node cut to fewer GPUs keeps the server's GPUs per NIC, and a NIC serves a GPU no faster
than the GPU's PCIe x16 link on NVSwitch and mesh servers too.

Before: ``cluster.gpus_per_node`` below the server's count set the NICs to
``min(server NICs, gpus_per_node)``, so DGX-1 or a PCIe server at 4 GPUs a node got 4 NICs, one
a GPU: twice the network rate a GPU of the real (2 GPUs a NIC) server has. And NVSwitch servers
had no PCIe rate on file, so a NIC faster than the GPU's x16 link was not capped (DGX H100 on
XDR: 94 GB/s a GPU over PCIe Gen5 x16, 64 GB/s line rate).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simulator.cli import main
from simulator.cluster_section import ClusterSection, resolve_cluster
from simulator.errors import ConfigError
from simulator.space import find_scenario
from tests.support import error_line
from topologies import Cluster, TopologyError, list_servers, load_cluster, load_server, nics_kept
from topologies.catalog import SERVERS_DIR

TINY = find_scenario("tiny-gpt-8gpu")
GEN_X16_BIDIR_GBPS = {3: 32, 4: 64, 5: 128}  # shared/data/hardware README: Gen4 64, Gen5 128


def _cut(server: str, gpus_per_node: int, **keys: Any) -> Cluster:
    gpu = load_server(server).gpu
    section = ClusterSection(
        gpu=gpu, server=server, num_gpus=4 * gpus_per_node, gpus_per_node=gpus_per_node, **keys
    )
    return resolve_cluster(section)


@pytest.mark.parametrize(
    ("server", "gpus", "nics"),
    [
        ("dgx1-v100", 4, 2),  # 2 GPUs a NIC (was 4 NICs)
        ("pcie-h100-8gpu", 4, 2),
        ("pcie-l40s-8gpu", 2, 1),
        ("dgx1-v100", 2, 1),
        ("dgx-a100", 4, 4),  # one NIC a GPU: as before
        ("gb200-nvl72", 8, 8),
    ],
)
def test_a_node_cut_keeps_the_servers_gpus_per_nic(server: str, gpus: int, nics: int) -> None:
    srv = load_server(server)
    assert nics_kept(srv, gpus) == nics
    assert _cut(server, gpus).server.nics_per_node == nics
    # the same GPUs per NIC as the whole server
    assert gpus / nics == srv.gpus_per_node / srv.nics_per_node


@pytest.mark.parametrize("server", ["dgx1-v100", "pcie-h100-8gpu"])
def test_a_cut_gpu_gets_the_network_rate_of_the_whole_servers_gpu(server: str) -> None:
    # ranks 0 and 4 sit on two nodes of the cut server, as ranks 0 and 8 on the whole one:
    # each GPU gets half its NIC (2 a NIC) either way, not the whole NIC
    srv = load_server(server)
    whole = load_cluster(server, gpus=16)
    cut = _cut(server, 4)
    half_nic = whole.group_links([0, 8]).inter_bw_bytes_per_s
    assert cut.group_links([0, 4]).inter_bw_bytes_per_s == pytest.approx(half_nic)
    assert whole.network is not None
    nic = whole.network.link.effective_bw_bytes_per_s
    assert half_nic <= nic * srv.nics_per_node / srv.gpus_per_node


def test_nics_per_node_given_with_the_cut_wins() -> None:
    assert _cut("dgx1-v100", 4, nics_per_node=4).server.nics_per_node == 4


def test_a_cut_that_would_share_a_nic_unevenly_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 3 GPUs at 2 a NIC: one NIC shared, one not; the model shares NICs evenly
    with pytest.raises(TopologyError, match="multiple of 2"):
        nics_kept(load_server("dgx1-v100"), 3)
    sets = [
        'cluster.server="dgx1-v100"',
        'cluster.gpu="v100-sxm2-32gb"',
        'training.dtype="fp16"',
        "cluster.gpus_per_node=3",
        "cluster.num_gpus=6",
    ]
    assert main(["simulate", str(TINY), *(x for s in sets for x in ("--set", s))]) == 2
    error_line(capsys, "cluster.gpus_per_node = 3", "multiple of 2", "nics_per_node")


@pytest.mark.parametrize("server", ["dgx1-v100", "dgx-h100"])
def test_a_node_larger_than_its_server_is_refused(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # a DGX-1 "node" of 16 kept the mesh links of GPUs 0-7 and left 8-15 without any, and a
    # DGX H100 of 16 became an NVSwitch box nobody sells; both simulated with exit 0
    srv = load_server(server)
    big = 2 * srv.gpus_per_node
    with pytest.raises(ConfigError, match=f"holds {srv.gpus_per_node} GPUs"):
        _cut(server, big)
    sets = [
        f'cluster.server="{server}"',
        f'cluster.gpu="{srv.gpu}"',
        'training.dtype="fp16"',
        f"cluster.gpus_per_node={big}",
        f"cluster.num_gpus={big}",
    ]
    assert main(["simulate", str(TINY), *(x for s in sets for x in ("--set", s))]) == 2
    error_line(capsys, f"cluster.gpus_per_node = {big}", f"at most {srv.gpus_per_node}")


# --- the GPU's PCIe link caps its NIC on NVSwitch and mesh servers --------------------------


PCIE_CAPPED = [
    ("dgx-h100", "ib-xdr"),
    ("hgx-h200", "ib-xdr"),
    ("dgx-b200", "ib-xdr"),
    ("dgx-a100", "ib-ndr"),
    ("amd-mi300x-platform", "roce-800gbe"),
]


@pytest.mark.parametrize(("server", "network"), PCIE_CAPPED)
def test_a_nic_faster_than_the_gpus_pcie_link_is_capped_by_it(server: str, network: str) -> None:
    srv = load_server(server)
    assert srv.pcie is not None and srv.nics_per_node == srv.gpus_per_node
    c = load_cluster(server, gpus=2 * srv.gpus_per_node, network=network)
    assert c.network is not None
    pcie = srv.pcie.bw_bytes_per_s_per_dir * srv.pcie.efficiency
    assert c.network.link.effective_bw_bytes_per_s > pcie  # the case the cap is for
    g = srv.gpus_per_node
    assert c.group_links([0, g]).inter_bw_bytes_per_s == pytest.approx(pcie)
    assert c.group_links(range(2 * g)).inter_bw_bytes_per_s == pytest.approx(g * pcie)


@pytest.mark.parametrize("server", [s.id for s in list_servers() if s.pcie is not None])
def test_at_its_own_network_a_catalog_nic_is_under_the_pcie_cap(server: str) -> None:
    # the default builds (NDR on Gen5, HDR on Gen4) are NIC-bound: each GPU gets its NIC share
    srv = load_server(server)
    c = load_cluster(server, gpus=2 * srv.gpus_per_node)
    assert c.network is not None and srv.pcie is not None
    nic = c.network.link.effective_bw_bytes_per_s
    assert nic <= srv.pcie.bw_bytes_per_s_per_dir * srv.pcie.efficiency
    share = nic * srv.nics_per_node / srv.gpus_per_node
    assert c.group_links([0, srv.gpus_per_node]).inter_bw_bytes_per_s == pytest.approx(share)


@pytest.mark.parametrize("server", [s.id for s in list_servers() if s.fabric != "pcie"])
def test_a_servers_pcie_rate_is_its_gpus_x16_link_or_absent(
    server: str, hardware_dir: Path
) -> None:
    """[pcie] is x16 both directions / 2 from gpus.json (its rate, else its generation's);
    a GPU whose generation is not on file (GB200: NVLink-C2C to Grace) has none."""
    srv = load_server(server)
    gpus = {r["id"]: r for r in json.loads((hardware_dir / "gpus.json").read_text())}
    gpu = gpus[srv.gpu]
    if gpu["pcie_gen"] is None:
        assert srv.pcie is None
        return
    assert srv.pcie is not None or srv.host_bw_bytes_per_s_per_dir is not None
    if srv.pcie is not None:
        bidir = gpu["pcie_x16_bw_bidir_GBps"] or GEN_X16_BIDIR_GBPS[gpu["pcie_gen"]]
        assert srv.pcie.bw_bytes_per_s_per_dir == pytest.approx(bidir / 2 * 1e9)


def test_pcie_on_a_pcie_fabric_is_refused(tmp_path: Path) -> None:
    # there the [intra] tier is the x16 link: two rates for one link
    path = tmp_path / "s.toml"
    text = (SERVERS_DIR / "pcie-h100-8gpu.toml").read_text()
    path.write_text(text + "\n[pcie]\nbw_bytes_per_s_per_dir = 6.4e10\nefficiency = 0.76\n")
    with pytest.raises(TopologyError, match=r"\[pcie\].*remove \[pcie\]"):
        load_server(str(path))
