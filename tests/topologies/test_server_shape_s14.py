"""A server file whose parts do not fit together (NICs shared unevenly, NVLS without an
NVSwitch, mesh pairs naming GPUs it lacks), a node without NICs, a missing file and an absurd
GPU count: one line naming the field or flag and the fix, exit 2."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support import edited, refused
from topologies.catalog import SERVERS_DIR, load_cluster, load_server
from topologies.spec import TopologyError

ARGV = ["collective", "--op", "all-reduce", "--bytes", "1e9"]


@pytest.mark.parametrize("nics", ["3", "5", "12"])
def test_nics_that_the_gpus_cannot_share_evenly_arerefused(nics: str, tmp_path: Path) -> None:
    path = edited(SERVERS_DIR / "dgx-h100.toml", "nics_per_node", nics, tmp_path / "s.toml")
    with pytest.raises(TopologyError, match=r"nics_per_node.*divide.*gpus_per_node"):
        load_server(str(path))


@pytest.mark.parametrize("nics", ["1", "2", "4", "16"])
def test_nics_shared_evenly_load(nics: str, tmp_path: Path) -> None:
    path = edited(SERVERS_DIR / "dgx-h100.toml", "nics_per_node", nics, tmp_path / "s.toml")
    assert load_server(str(path)).nics_per_node == int(nics)


def test_nvls_on_a_fabric_without_nvswitch_isrefused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the model ignored it (NVLS needs an NVSwitch) while `tilesim list servers` printed "+nvls"
    path = edited(SERVERS_DIR / "dgx-h100.toml", "fabric", '"pcie"', tmp_path / "s.toml")
    refused([*ARGV, "--gpus", "8", "--cluster", str(path)], capsys, "nvls", "nvswitch")


@pytest.mark.parametrize("pairs", ["[[0, 8]]", "[[3, 3]]"])
def test_mesh_pairs_must_name_two_gpus_of_the_node(pairs: str, tmp_path: Path) -> None:
    src = (SERVERS_DIR / "dgx1-v100.toml").read_text()
    start = src.index("mesh_edges = [")
    end = src.index("\n]\n", start) + 3
    path = tmp_path / "s.toml"
    path.write_text(src[:start] + f"mesh_edges = {pairs}\n" + src[end:])
    with pytest.raises(TopologyError, match="mesh_edges"):
        load_server(str(path))


def test_a_node_without_nics_does_not_ask_for_the_network_it_was_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = edited(SERVERS_DIR / "dgx-h100.toml", "nics_per_node", "0", tmp_path / "s.toml")
    argv = [*ARGV, "--gpus", "16", "--cluster", str(path), "--network", "ib-ndr"]
    line = refused(argv, capsys, "nics_per_node", "--gpus 8")
    assert "pass --network" not in line


def test_a_missing_server_file_is_named_as_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused([*ARGV, "--gpus", "8", "--cluster", "no/such/box.toml"], capsys, "box.toml")
    assert "no such file" in line


def test_more_gpus_than_modelled_are_refused_fast(tmp_path: Path) -> None:
    # a server file allowing 1e8 nodes took minutes and gigabytes for --gpus 1e8
    path = edited(SERVERS_DIR / "dgx-h100.toml", "max_nodes", "100000000", tmp_path / "s.toml")
    start = time.perf_counter()
    with pytest.raises(TopologyError, match=r"--gpus 100000000.*1,048,576"):
        load_cluster(str(path), gpus=100_000_000)
    assert time.perf_counter() - start < 1.0
