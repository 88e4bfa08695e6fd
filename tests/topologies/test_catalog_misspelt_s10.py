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
