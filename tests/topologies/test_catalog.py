from __future__ import annotations

import json
from pathlib import Path

import pytest

from topologies import TopologyError, list_networks, list_servers, load_cluster, load_server
from topologies.catalog import SERVERS_DIR


def test_every_toml_loads() -> None:
    servers, networks = list_servers(), list_networks()
    assert {"dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72"} <= {
        s.id for s in servers
    }
    assert {"ib-hdr", "ib-ndr", "ib-xdr", "roce-400gbe"} <= {n.id for n in networks}
    for s in servers:
        assert s.default_network in {n.id for n in networks}


def test_ids_match_shared(hardware_dir: Path) -> None:
    shared_servers = {r["id"]: r for r in json.loads((hardware_dir / "servers.json").read_text())}
    shared_nets = {r["id"]: r for r in json.loads((hardware_dir / "networks.json").read_text())}
    gpu_ids = {r["id"] for r in json.loads((hardware_dir / "gpus.json").read_text())}
    for s in list_servers():
        assert s.gpu in gpu_ids
        if s.id.startswith("pcie-"):
            continue  # generic PCIe boxes have no shared record
        rec = shared_servers[s.id]
        assert s.gpus_per_node == rec["gpus_per_node"]
        unidir = rec["per_gpu_fabric_bw_unidir_GBps"] * 1e9
        if s.fabric == "nvswitch":  # bandwidth per direction, never the bidirectional sum
            assert s.intra.bw_bytes_per_s_per_dir == pytest.approx(unidir)
        else:  # rings on a mesh use at most all the links
            assert s.intra.bw_bytes_per_s_per_dir <= unidir
    for n in list_networks():
        rate = shared_nets[n.id]["port_rate_GBps_per_direction"] * 1e9
        assert n.link.bw_bytes_per_s_per_dir == pytest.approx(rate)


def test_cluster_size_from_gpus() -> None:
    c = load_cluster("dgx-h100", gpus=12)
    assert c.spec.num_nodes == 2 and c.world_size == 16
    assert c.network is not None and c.network.id == "ib-ndr"
    roce = load_cluster("dgx-a100", gpus=16, network="roce-200gbe").network
    assert roce is not None and roce.id == "roce-200gbe"


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"server": "nope", "gpus": 8}, "unknown server"),
        ({"server": "dgx-h100", "gpus": 0}, "--gpus"),
        ({"server": "dgx-h100", "gpus": 10**7}, "more than"),
        ({"server": "dgx-h100", "gpus": 16, "network": "ib-foo"}, "unknown network"),
    ],
)
def test_bad_input_names_the_fix(kwargs: dict[str, object], word: str) -> None:
    with pytest.raises(TopologyError, match=word):
        load_cluster(**kwargs)  # type: ignore[arg-type]


def test_load_by_path(tmp_path: Path) -> None:
    src = SERVERS_DIR / "dgx-h100.toml"
    dst = tmp_path / "my-box.toml"
    dst.write_text(src.read_text().replace("max_nodes = 2048", "max_nodes = 4"))
    assert load_server(str(dst)).max_nodes == 4
    bad = tmp_path / "bad-box.toml"
    bad.write_text(src.read_text().replace("gpus_per_node = 8", "gpus_per_node = 8\nbogus = 1"))
    with pytest.raises(TopologyError, match="bogus"):
        load_server(str(bad))
