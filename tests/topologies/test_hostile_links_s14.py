"""Server and network files, and ``--degrade`` scales, whose numbers are finite but absurd:
each is refused in one line naming the field and the fix (exit 2), instead of a traceback, a
time printed as ``inf ms`` or ``Infinity`` in JSON, or a 400-billion-millisecond collective."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from tests.support import edited, refused
from topologies.catalog import NETWORKS_DIR, SERVERS_DIR, load_network, load_server
from topologies.spec import TopologyError

SERVER = SERVERS_DIR / "dgx-h100.toml"
NETWORK = NETWORKS_DIR / "ib-ndr.toml"
ARGV = ["collective", "--op", "all-reduce", "--bytes", "1e9", "--json"]


@pytest.mark.parametrize("value", ["1e-300", "1.7e308", "100.0"])
def test_an_absurd_link_bandwidth_isrefused(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1e-300 priced a 1 GB all-reduce at inf ms ("Infinity" in JSON); 1.7e308 B/s overflowed
    # the NICs' sum to inf and an all-to-all divided by zero (a traceback)
    server = edited(SERVER, "bw_bytes_per_s_per_dir", value, tmp_path / "s.toml")
    refused([*ARGV, "--gpus", "16", "--cluster", str(server)], capsys, "bw_bytes_per_s_per_dir")


def test_a_huge_network_bandwidth_no_longer_divides_by_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    net = edited(NETWORK, "bw_bytes_per_s_per_dir", "1.7e308", tmp_path / "n.toml")
    server = edited(SERVER, "gpus_per_node", "1", tmp_path / "one.toml")
    edited(server, "nics_per_node", "2", server)
    argv = ["collective", "--op", "all-to-all", "--bytes", "1e9", "--gpus", "4"]
    refused([*argv, "--cluster", str(server), "--network", str(net)], capsys, "link.bw_bytes")


@pytest.mark.parametrize("key", ["latency_s", "launch_latency_s"])
def test_a_latency_of_more_than_a_second_isrefused(key: str, tmp_path: Path) -> None:
    # a network latency_s of 1e9 printed a 400,000,000,013 ms all-reduce
    src = NETWORK if key == "latency_s" else SERVER
    path = edited(src, key, "1e9", tmp_path / "x.toml")
    with pytest.raises(TopologyError, match=key):
        (load_network if key == "latency_s" else load_server)(str(path))


def test_a_vanishing_efficiency_isrefused(tmp_path: Path) -> None:
    path = edited(NETWORK, "efficiency", "1e-300", tmp_path / "n.toml")
    with pytest.raises(TopologyError, match=r"link\.efficiency"):
        load_network(str(path))


@pytest.mark.parametrize("scale", ["1e-300", "1e-320"])
def test_a_vanishing_degrade_scale_isrefused(
    scale: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1e-320 printed time_s Infinity; 1e-300 a 3.5e291 ms all-reduce
    argv = [*ARGV, "--gpus", "16", "--cluster", "dgx-h100", "--degrade", f"intra:0:0:{scale}"]
    refused(argv, capsys, "--degrade", "SCALE")


def test_a_small_degrade_scale_still_runs(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*ARGV, "--gpus", "16", "--cluster", "dgx-h100", "--degrade", "inter:0:0:0.001"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["time_s"] > 0
