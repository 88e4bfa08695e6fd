"""A misspelt field of a user's server or network TOML names the key typed and the field it
was meant to be (pydantic reports the real name as missing first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from topologies.catalog import NETWORKS_DIR, SERVERS_DIR, load_network, load_server
from topologies.spec import TopologyError


def _copy(src: Path, dst: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text
    dst.write_text(text.replace(old, new, 1))
    return dst


def test_misspelt_server_field_names_the_intended_one(tmp_path: Path) -> None:
    path = _copy(
        SERVERS_DIR / "dgx-h100.toml", tmp_path / "s.toml", "nics_per_node", "nic_per_node"
    )
    with pytest.raises(
        TopologyError,
        match="'nic_per_node' is not a ServerSpec field; did you mean 'nics_per_node'",
    ):
        load_server(str(path))


def test_unknown_network_field_is_named(tmp_path: Path) -> None:
    src = sorted(NETWORKS_DIR.glob("*.toml"))[0]
    path = tmp_path / "n.toml"
    path.write_text("flux_capacitor = 1\n" + src.read_text())  # top level, before any table
    with pytest.raises(
        TopologyError, match="'flux_capacitor' is not a NetworkSpec field; remove it"
    ):
        load_network(str(path))


def test_a_server_file_naming_an_unknown_network_is_refused_with_file_and_field(
    tmp_path: Path,
) -> None:
    """It failed only where the network was loaded, as "unknown network 'nope'" (even in a
    one-node `serve`, which sends nothing over it), naming neither the file nor the field."""
    path = _copy(
        SERVERS_DIR / "dgx-a100.toml",
        tmp_path / "s.toml",
        'default_network = "ib-hdr"',
        'default_network = "nope"',
    )
    with pytest.raises(TopologyError, match=r"s\.toml: field 'default_network': unknown network"):
        load_server(str(path))


def test_serve_names_a_server_files_unknown_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulator.cli import main

    path = _copy(
        SERVERS_DIR / "dgx-a100.toml", tmp_path / "s.toml", 'gpu = "a100-sxm4-80gb"', 'gpu = "nope"'
    )
    argv = ["serve", "--model", "tiny-gpt", "--batch", "1", "--prompt", "8", "--gen", "2"]
    assert main([*argv, "--server", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--server {path}: field 'gpu': unknown GPU 'nope'" in err and err.count("\n") == 1


def test_a_server_files_network_path_is_left_to_where_it_is_read(tmp_path: Path) -> None:
    """A scenario reads a .toml network beside itself (`beside_scenario`): the server file
    is not the place to resolve that path."""
    path = _copy(
        SERVERS_DIR / "dgx-a100.toml",
        tmp_path / "s.toml",
        'default_network = "ib-hdr"',
        'default_network = "my_net.toml"',
    )
    assert load_server(str(path)).default_network == "my_net.toml"
