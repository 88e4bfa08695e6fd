"""A rank group on a mesh node fabric gets the links among its GPUs, not a share of a full mesh.

Before: every mesh group got ``(ranks - 1) / (gpus - 1)`` of the GPU's links, one link a pair,
so on the DGX-1 V100 a TP quad {0,1,2,3} got 3/7 x 150 = 64.3 GB/s (its rings use 4 links:
100), the pair {0,4} 21.4 (2 NVLinks: 50) and {0,5}, which no NVLink joins, 21.4 too (PCIe:
16); `to_graph` gave each DGX-1 GPU 4 x 25 = 100 GB/s of edges, not its 6 links' 150.
The MI300X (a full mesh, one link a pair) keeps its numbers bit for bit.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from tests.support import refused
from topologies.catalog import SERVERS_DIR, list_servers, load_cluster, load_server
from topologies.collectives import collective_estimate
from topologies.mesh import ring_links
from topologies.spec import TopologyError

NVLINK2_LINK = 25e9  # bytes/s per direction of one NVLink2 link
EFFICIENCY = 0.80  # the DGX-1 intra tier's efficiency
PCIE3_X16 = 16e9  # 32 GB/s both directions
HOST_EFFICIENCY = 0.76  # the host path's (NCCL's PCIe Gen3 x16 figure), not the NVLink tier's
# `nvidia-smi topo -m` of a DGX-1 V100, GPU rows 0-7 (NV#: # bonded NVLinks, SYS: none)
TOPO_M = """
X   NV1 NV1 NV2 NV2 SYS SYS SYS
NV1 X   NV2 NV1 SYS NV2 SYS SYS
NV1 NV2 X   NV2 SYS SYS NV1 SYS
NV2 NV1 NV2 X   SYS SYS SYS NV1
NV2 SYS SYS SYS X   NV1 NV1 NV2
SYS NV2 SYS SYS NV1 X   NV2 NV1
SYS SYS NV1 SYS NV1 NV2 X   NV2
SYS SYS SYS NV1 NV2 NV1 NV2 X
"""


def _dgx1_line_bw(ranks: tuple[int, ...]) -> float:
    return load_cluster("dgx1-v100", gpus=16).group_links(ranks).intra_line_bw_bytes_per_s


def test_dgx1_links_are_those_nvidia_smi_prints() -> None:
    rows = [line.split() for line in TOPO_M.strip().splitlines()]
    want = {
        (a, b): int(rows[a][b][2:])
        for a, b in itertools.combinations(range(8), 2)
        if rows[a][b].startswith("NV")
    }
    s = load_server("dgx1-v100")
    assert s.pair_links() == want
    assert s.mesh_links_per_gpu() == [6] * 8  # 4 neighbours, 6 links each
    assert all(sum(1 for p in want if g in p) == 4 for g in range(8))


@pytest.mark.parametrize(
    ("ranks", "links"),
    [
        ((0, 1, 2, 3), 4),  # quad: rings 0-1-2-3 and 0-2-1-3, both ways; GPU 0 has 1+1+2 links
        ((4, 5, 6, 7), 4),
        ((0, 4), 2),  # NV2: a ring of two uses both links
        ((0, 1), 1),  # NV1
        ((0, 2, 4, 6), 2),  # the one ring 0-2-6-4 has single links: one link each way
        ((0, 1, 4, 5), 2),  # the one ring 0-1-5-4: 0-1 and 4-5 single
        (tuple(range(8)), 6),  # three rings through all 8 cover the 24 links
    ],
)
def test_dgx1_group_gets_its_rings_links(ranks: tuple[int, ...], links: int) -> None:
    g = load_cluster("dgx1-v100", gpus=16).group_links(ranks)
    assert g.intra_line_bw_bytes_per_s == pytest.approx(links * NVLINK2_LINK, rel=1e-12)
    assert g.intra_bw_bytes_per_s == pytest.approx(links * NVLINK2_LINK * EFFICIENCY, rel=1e-12)


@pytest.mark.parametrize("ranks", [(0, 5), (0, 6), (3, 4), (0, 1, 5)])
def test_dgx1_gpus_without_an_nvlink_ring_take_the_pcie_path(ranks: tuple[int, ...]) -> None:
    # 0-5: no NVLink (SYS); {0,1,5}: 0-1 and 1-5 are linked but 5-0 is not, so no NVLink ring;
    # the host path's rate is PCIe 3.0 x16 at PCIe's efficiency
    g = load_cluster("dgx1-v100", gpus=16).group_links(ranks)
    assert g.intra_bw_bytes_per_s == pytest.approx(PCIE3_X16 * HOST_EFFICIENCY, rel=1e-12)


def test_a_group_on_two_nodes_gets_its_worst_node() -> None:
    assert _dgx1_line_bw((0, 1, 2, 3, 8, 9, 10, 11)) == pytest.approx(4 * NVLINK2_LINK)
    assert _dgx1_line_bw((0, 1, 2, 3, 8, 9)) == pytest.approx(1 * NVLINK2_LINK)
    assert _dgx1_line_bw((0, 8)) == 0.0  # one rank a node: no in-node traffic, as before


def test_dgx1_tp_quad_all_reduce_closed_form() -> None:
    """Ring all-reduce of 1 GB over the quad: 2(n-1)/n S at 4 links x 25 GB/s x 0.8."""
    c = load_cluster("dgx1-v100", gpus=8)
    est = collective_estimate("all-reduce", 1e9, (0, 1, 2, 3), c, algorithm="ring")
    s = c.server
    data_s = 2 * 3 / 4 * 1e9 / (4 * NVLINK2_LINK * EFFICIENCY)
    latency_s = 6 * s.intra.latency_s
    depth_s = latency_s * 5 / 6
    base_s = 8.4e-6  # NCCL's ring/Simple base latency (collectives.md section 3)
    want = s.launch_latency_s + base_s + latency_s + data_s + 2 * math.sqrt(depth_s * data_s)
    assert (est.algorithm, est.protocol) == ("ring", "simple")
    assert est.time_s == pytest.approx(want, rel=1e-12)


def test_mi300x_full_mesh_keeps_its_numbers_bit_for_bit() -> None:
    """One xGMI link a pair: k GPUs get k - 1 links, the old ``(k-1)/(n-1)`` share exactly."""
    c = load_cluster("amd-mi300x-platform", gpus=8)
    intra = c.server.intra
    for k in range(2, 9):
        for ranks in itertools.combinations(range(8), k):
            g = c.group_links(ranks)
            share = 1.0 * min(1.0, (k - 1) / 7)
            assert g.intra_line_bw_bytes_per_s == intra.bw_bytes_per_s_per_dir * share
            assert g.intra_bw_bytes_per_s == intra.effective_bw_bytes_per_s * share
    assert c.group_links((0, 1)).intra_line_bw_bytes_per_s == pytest.approx(64e9)


@pytest.mark.parametrize("server", [s.id for s in list_servers() if s.fabric == "mesh"])
def test_to_graph_gives_each_gpu_all_its_links(server: str) -> None:
    s = load_server(server)
    per_link = s.intra.bw_bytes_per_s_per_dir / s.links_per_gpu
    g = load_cluster(server, gpus=s.gpus_per_node).to_graph()
    for i in range(s.gpus_per_node):
        edges = g.edges(("gpu", 0, i), data=True)
        total = sum(d["bw_bytes_per_s_per_dir"] for _, _, d in edges if d["tier"] == "intra")
        assert total == pytest.approx(s.links_per_gpu * per_link, rel=1e-12)


def test_dgx1_graph_edges_carry_each_pairs_links() -> None:
    g = load_cluster("dgx1-v100", gpus=8).to_graph()
    edge = g.edges
    assert edge[("gpu", 0, 0), ("gpu", 0, 3)]["bw_bytes_per_s_per_dir"] == 2 * NVLINK2_LINK
    assert edge[("gpu", 0, 0), ("gpu", 0, 1)]["bw_bytes_per_s_per_dir"] == NVLINK2_LINK
    assert not g.has_edge(("gpu", 0, 0), ("gpu", 0, 5))


def test_ring_links_are_fractional_packings() -> None:
    full4 = (((0, 1), 1), ((0, 2), 1), ((0, 3), 1), ((1, 2), 1), ((1, 3), 1), ((2, 3), 1))
    # K4: no 3 arc-disjoint directed Hamiltonian cycles exist (Tillson), but its 3 undirected
    # ones at half rate each, both ways, load every link direction fully: 3 links a GPU
    assert ring_links((0, 1, 2, 3), full4) == 3.0
    square = (((0, 1), 2), ((1, 2), 1), ((2, 3), 2), ((0, 3), 1))  # one ring; 1-link sides bound
    assert ring_links((0, 1, 2, 3), square) == 2.0
    assert ring_links((0, 1, 2), (((0, 1), 2), ((1, 2), 3), ((0, 2), 1))) == 2.0
    assert ring_links((0, 2), full4) == 1.0
    assert ring_links((0, 1, 2), (((0, 1), 1), ((1, 2), 1))) == 0.0  # a path, no ring


# --- the server file ------------------------------------------------------------------------


def _with_edges(edges: str, tmp_path: Path, src: str = "") -> Path:
    src = src or (SERVERS_DIR / "dgx1-v100.toml").read_text()
    start = src.index("mesh_edges = [")
    end = src.index("\n]\n", start) + 3
    path = tmp_path / "s.toml"
    path.write_text(src[:start] + f"mesh_edges = {edges}\n" + src[end:])
    return path


@pytest.mark.parametrize(
    ("edges", "needles"),
    [
        ("[[0, 1, 0]]", ("mesh_edges", "at least 1 link")),
        ("[[0, 1], [1, 0]]", ("mesh_edges", "twice")),
        ("[[0, 1, 4], [0, 2, 3]]", ("GPU 0 has 7 links", "links_per_gpu = 6")),
    ],
)
def test_bad_link_counts_are_refused(
    edges: str, needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _with_edges(edges, tmp_path)
    with pytest.raises(TopologyError, match=needles[0]):
        load_server(str(path))
    argv = ["collective", "--op", "all-reduce", "--bytes", "1e9", "--gpus", "8"]
    refused([*argv, "--cluster", str(path)], capsys, *needles)


def test_a_file_must_wire_every_link(tmp_path: Path) -> None:
    # the old DGX-1 file: 16 pairs of one link, 4 of each GPU's 6 links
    pairs = "[[0,1],[0,2],[0,3],[1,2],[1,3],[2,3],[4,5],[4,6],[4,7],[5,6],[5,7],[6,7]," + (
        "[0,4],[1,5],[2,6],[3,7]]"
    )
    with pytest.raises(TopologyError, match=r"GPU 0 has 4 links.*\[a, b, links\]"):
        load_server(str(_with_edges(pairs, tmp_path)))


def test_unlinked_pairs_need_a_host_path(tmp_path: Path) -> None:
    path = _with_edges("[[0, 1, 6], [2, 3, 6], [4, 5, 6], [6, 7, 6]]", tmp_path)
    assert load_server(str(path)).host_bw_bytes_per_s_per_dir == PCIE3_X16
    bare = tmp_path / "bare.toml"  # load_server caches by path
    bare.write_text(path.read_text().replace("host_bw_bytes_per_s_per_dir = 1.6e10\n", ""))
    with pytest.raises(TopologyError, match=r"GPUs 0 and 2.*host_bw_bytes_per_s_per_dir"):
        load_server(str(bare))


@pytest.mark.parametrize(
    "line",
    ["host_bw_bytes_per_s_per_dir = 1.6e10", "mesh_edges = [[0, 1, 18]]", "host_efficiency = 0.7"],
)
def test_mesh_keys_on_a_switch_are_refused(line: str, tmp_path: Path) -> None:
    # ignored before (mesh_edges were range-checked, then never read on an NVSwitch)
    src = (SERVERS_DIR / "dgx-h100.toml").read_text()
    path = tmp_path / "s.toml"
    path.write_text(src.replace("[intra]", f"{line}\n\n[intra]", 1))
    with pytest.raises(TopologyError, match=line.split()[0] + ".*read only on fabric"):
        load_server(str(path))


def test_dgx1_host_path_is_a_vetted_pcie3_x16(hardware_dir: Path) -> None:
    gpus = {r["id"]: r for r in json.loads((hardware_dir / "gpus.json").read_text())}
    s = load_server("dgx1-v100")
    assert gpus[s.gpu]["pcie_gen"] == gpus["v100-pcie-32gb"]["pcie_gen"] == 3
    x16 = gpus["v100-pcie-32gb"]["pcie_x16_bw_bidir_GBps"] * 1e9 / 2  # 32 GB/s both ways
    assert s.host_bw_bytes_per_s_per_dir == pytest.approx(x16)


def test_a_host_path_without_its_own_efficiency_takes_the_intra_tiers(tmp_path: Path) -> None:
    """``host_efficiency`` prices the PCIe path apart from the NVLink tier (DGX-1: 0.76 against
    0.80, which it read before); a file without it keeps the [intra] tier's, as before."""
    src = (SERVERS_DIR / "dgx1-v100.toml").read_text()
    assert load_server("dgx1-v100").host_path == (PCIE3_X16, HOST_EFFICIENCY)
    path = tmp_path / "no_host_efficiency.toml"
    path.write_text(src.replace("host_efficiency = 0.76\n", ""))
    assert load_server(str(path)).host_path == (PCIE3_X16, EFFICIENCY)


def test_a_host_efficiency_without_a_host_path_is_refused(tmp_path: Path) -> None:
    """It was read by nothing (``host_path`` is None without a rate), so a file that set it
    alone got the NVLink tier's pricing with no word."""
    # every GPU linked to every other (4 GPUs, 2 links a pair), so no ring takes the host path
    src = (SERVERS_DIR / "dgx1-v100.toml").read_text()
    src = src.replace("gpus_per_node = 8", "gpus_per_node = 4")
    path = _with_edges(
        "[[0, 1, 2], [0, 2, 2], [0, 3, 2], [1, 2, 2], [1, 3, 2], [2, 3, 2]]", tmp_path, src
    )
    assert load_server(str(path)).host_path == (PCIE3_X16, HOST_EFFICIENCY)
    bare = tmp_path / "rate_missing.toml"
    bare.write_text(path.read_text().replace("host_bw_bytes_per_s_per_dir = 1.6e10\n", ""))
    with pytest.raises(TopologyError, match=r"host_efficiency.*give host_bw_bytes_per_s_per_dir"):
        load_server(str(bare))
