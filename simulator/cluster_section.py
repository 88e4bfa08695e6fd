"""A scenario's ``[cluster]`` table (`ClusterSection`) and the `Cluster` it names
(`resolve_cluster`); GPU, server and network files are read relative to the scenario's folder
(`beside_scenario`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from forecast.files import find_relative
from simulator.errors import ConfigError, pydantic_msg
from topologies import (
    Cluster,
    ClusterSpec,
    ServerSpec,
    TopologyError,
    load_network,
    load_server,
    nics_kept,
)
from topologies.spec import MAX_NICS_PER_NODE, MAX_OVERSUBSCRIPTION

# strict: a TOML ``true`` or ``2.0`` is not a GPU count, nor ``"yes"`` a switch
_FROZEN = ConfigDict(frozen=True, extra="forbid", strict=True)
# The most GPUs a job may have: a layout's rank groups are tuples of ranks, so 2^30 GPUs ran
# out of memory (or for hours) before any message; 2^23 took a minute and 1.5 GB per process.
MAX_GPUS = 2**20


class ClusterSection(BaseModel):
    """GPU type and the intra-/inter-node fabrics."""

    model_config = _FROZEN
    gpu: str = Field(
        min_length=1,
        description="catalog id (`tilesim list gpus`), device name, or a GPU .toml / NeuSight "
        ".json path (relative to the scenario's folder, else to the current folder)",
    )
    server: str = Field(
        min_length=1,
        description="intra-node fabric: catalog id (`tilesim list servers`) or a .toml path "
        "(as gpu's)",
    )
    network: str | None = Field(
        default=None,
        min_length=1,
        description="inter-node fabric (`tilesim list networks`) or a .toml path (as gpu's); "
        "default: the server's default network; multi-node only",
    )
    num_gpus: int = Field(
        gt=0, le=MAX_GPUS, description=f"GPUs in the job: tp x cp x pp x dp (at most {MAX_GPUS:,})"
    )
    gpus_per_node: int | None = Field(
        default=None,
        gt=0,
        description="default and upper bound: the server's; its NICs follow, at the server's "
        "GPUs per NIC (DGX-1, 2 a NIC: 4 GPUs keep 2 NICs), unless nics_per_node is set",
    )
    nics_per_node: int | None = Field(
        default=None, ge=0, le=MAX_NICS_PER_NODE, description="default: the server's"
    )
    nodes_per_leaf: int = Field(
        default=32, gt=0, description="nodes under one leaf switch group (SuperPOD SU: 32)"
    )
    oversubscription: float = Field(
        default=1.0,
        ge=1,
        le=MAX_OVERSUBSCRIPTION,
        allow_inf_nan=False,
        description="leaf down:up bandwidth ratio (1 = non-blocking fat tree; at most 64)",
    )


def beside_scenario(base_dir: str, ref: str, key: str) -> str:
    """A catalog id as it is; a relative ``.toml``/``.json`` path from the scenario's folder,
    then from the current folder (`forecast.files.find_relative`); a `ConfigError` naming
    ``key`` and both folders where neither holds it."""
    if Path(ref).suffix not in (".toml", ".json"):
        return ref
    found = find_relative(ref, Path(base_dir))
    if found is None:
        raise ConfigError(
            f"{key}: file {ref} is neither in the scenario's folder ({Path(base_dir) / ref}) "
            f"nor in the current folder ({Path.cwd()}); give a path relative to the scenario "
            "file, or an absolute one"
        )
    return found


def resolve_cluster(c: ClusterSection, base_dir: str = ".") -> Cluster:
    """A `Cluster` of ``num_gpus`` GPUs of the server type (per-node counts overridable);
    server and network TOML paths relative to ``base_dir`` (the scenario's folder)."""
    try:
        server = load_server(beside_scenario(base_dir, c.server, "cluster.server"))
    except TopologyError as e:
        raise ConfigError(f"cluster.server: {e}") from e
    if c.gpus_per_node is not None and c.gpus_per_node > server.gpus_per_node:
        raise ConfigError(
            f"cluster.gpus_per_node = {c.gpus_per_node}: {server.id} holds "
            f"{server.gpus_per_node} GPUs; use at most {server.gpus_per_node}, or describe a "
            "larger server in a .toml file and give its path as cluster.server"
        )
    update: dict[str, Any] = {}
    if c.gpus_per_node is not None and c.gpus_per_node != server.gpus_per_node:
        update["gpus_per_node"] = c.gpus_per_node
    if c.nics_per_node is not None:
        update["nics_per_node"] = c.nics_per_node
    elif update:  # the GPUs kept keep their NICs: the server's GPUs per NIC hold
        try:
            update["nics_per_node"] = nics_kept(server, c.gpus_per_node or 0)
        except TopologyError as e:
            raise ConfigError(f"cluster.{e}") from None
    server = _with_counts(server, update) if update else server
    nodes = math.ceil(c.num_gpus / server.gpus_per_node)
    if nodes > 1 and server.nics_per_node < 1:
        raise ConfigError(
            f"cluster.nics_per_node: {nodes} nodes with no NIC cannot talk; give at least 1"
        )
    net_id = c.network or server.default_network  # a server file's path: from its folder
    key = "cluster.network" if c.network else f"cluster.server ({server.id})'s default_network"
    try:
        net = load_network(beside_scenario(base_dir, net_id, key)) if net_id else None
    except TopologyError as e:
        raise ConfigError(f"{key}: {e}") from e
    if nodes > 1 and net is None:
        raise ConfigError(f"cluster.network: {nodes} nodes need a network id")
    spec = ClusterSpec(
        server=server,
        network=net,
        num_nodes=nodes,
        nodes_per_leaf=c.nodes_per_leaf,
        oversubscription=c.oversubscription,
    )
    return Cluster(spec)


def _with_counts(server: ServerSpec, update: dict[str, Any]) -> ServerSpec:
    """``server`` with the scenario's per-node counts, checked as a server file is (NICs shared
    evenly; `model_copy` checked nothing); a mesh keeps the links among the GPUs it keeps."""
    fields = {**server.model_dump(), **update}
    if server.mesh_edges is not None:
        n = fields["gpus_per_node"]
        fields["mesh_edges"] = [e for e in server.mesh_edges if max(e[:2]) < n]
    try:
        return ServerSpec.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        msg = pydantic_msg(err)
        raise ConfigError(f"cluster.gpus_per_node/nics_per_node on {server.id}: {msg}") from None
