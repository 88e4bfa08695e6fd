from __future__ import annotations

import networkx as nx
import pytest

from topologies import Degradation, TopologyError, load_cluster


def test_node_of_and_local_rank() -> None:
    c = load_cluster("dgx-h100", gpus=32)
    assert [c.node_of(r) for r in (0, 7, 8, 31)] == [0, 0, 1, 3]
    assert c.local_rank_of(9) == 1
    with pytest.raises(TopologyError, match="outside"):
        c.node_of(32)


def test_megatron_placement_tp_innermost() -> None:
    c = load_cluster("dgx-h100", gpus=32)
    groups = c.placement(tp=4, dp=2, pp=4)
    assert groups["tp"][0] == (0, 1, 2, 3)
    assert groups["dp"][0] == (0, 4)
    assert groups["pp"][0] == (0, 8, 16, 24)
    for dim, size in (("tp", 4), ("dp", 2), ("pp", 4)):
        flat = sorted(r for g in groups[dim] for r in g)
        assert flat == list(range(32)) and all(len(g) == size for g in groups[dim])


def test_placement_other_order() -> None:
    groups = load_cluster("dgx-h100", gpus=16).placement(tp=2, dp=4, pp=2, order=("dp", "tp", "pp"))
    assert groups["dp"][0] == (0, 1, 2, 3)
    assert groups["tp"][0] == (0, 4)


def test_tier_of() -> None:
    c = load_cluster("dgx-h100", gpus=32)
    groups = c.placement(tp=8, dp=4, pp=1)
    assert c.tier_of(groups["tp"][0]).name == "nvlink4-nvswitch"
    assert c.tier_of(groups["dp"][0]).name == "ib-ndr"
    assert c.tier_of([3]).name == "nvlink4-nvswitch"


def test_group_links_rail_share() -> None:
    c = load_cluster("dgx-h100", gpus=32)
    full = c.group_links(range(32))
    one_per_node = c.group_links([0, 8, 16, 24])
    assert full.inter_bw_bytes_per_s == pytest.approx(8 * one_per_node.inter_bw_bytes_per_s)


def test_graph_shape() -> None:
    c = load_cluster("dgx-h100", gpus=16)
    g = c.to_graph()
    gpus = [n for n, d in g.nodes(data=True) if d["kind"] == "gpu"]
    assert len(gpus) == 16
    assert nx.is_connected(g)
    assert g.edges[("gpu", 0, 0), ("nvswitch", 0)]["bw_bytes_per_s_per_dir"] == pytest.approx(
        4.5e11
    )
    mesh = load_cluster("amd-mi300x-platform", gpus=8).to_graph()
    assert mesh.degree[("gpu", 0, 0)] == 7 + 1  # 7 peers + its NIC


def test_degraded_nvlink_in_graph() -> None:
    d = Degradation(tier="intra", node=0, local_rank=2, bw_scale=17 / 18)
    g = load_cluster("dgx-h100", gpus=8, degradations=(d,)).to_graph()
    assert g.edges[("gpu", 0, 2), ("nvswitch", 0)]["bw_bytes_per_s_per_dir"] == pytest.approx(
        4.5e11 * 17 / 18
    )
