"""The server and network catalogs: one TOML file per item, file stem = id.

Ids equal those of ``shared/data/hardware`` (``dgx-h100``, ``ib-ndr``). A cluster is a server id
plus a GPU count: ``nodes = ceil(gpus / gpus_per_node)``; the network defaults to the server's
own compute NICs.
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from functools import cache
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from topologies.cluster import Cluster
from topologies.spec import ClusterSpec, Degradation, NetworkSpec, ServerSpec, TopologyError

DATA_DIR = Path(__file__).parent / "data"
SERVERS_DIR = DATA_DIR / "servers"
NETWORKS_DIR = DATA_DIR / "networks"

_M = TypeVar("_M", bound=BaseModel)
MAX_GPUS = 2**20  # 1,048,576: 64 times the largest vetted fabric (2,048 DGX nodes)


def _load(path: Path, model: type[_M]) -> _M:
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise TopologyError(f"cannot read {path}: {e}") from e
    raw.setdefault("id", path.stem)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise TopologyError(f"{path}: {_complaint(e, model)}") from e


def _complaint(e: ValidationError, model: type[BaseModel]) -> str:
    """Pydantic's first complaint in one line; a key the schema lacks first, with the field
    it most resembles (a misspelt required field is also missing, under its real name)."""
    extra = [x for x in e.errors() if x["type"] == "extra_forbidden" and len(x["loc"]) == 1]
    if extra:
        key = str(extra[0]["loc"][0])
        near = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}?" if near else "remove it"
        return f"field {key!r} is not a {model.__name__} field; {hint}"
    first = e.errors()[0]
    loc = ".".join(str(x) for x in first["loc"])
    if first["type"] == "value_error" and not loc:  # a check across fields: its own sentence
        return str(first["ctx"]["error"])
    if first["type"] in ("int_type", "float_type"):
        want = "a whole number" if first["type"] == "int_type" else "a number"
        value = first["input"]
        if isinstance(value, bool):
            return f"field {loc!r} must be {want}, got {json.dumps(value)}; write a number"
        if isinstance(value, str):
            return f"field {loc!r} must be {want}, got {json.dumps(value)}; drop the quotes"
        return f"field {loc!r} must be {want}, got {value!r}"
    if first["type"] == "missing":
        return f"field {loc!r} is missing; add it"
    return f"field {loc!r}: {first['msg']}"


def _ids(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.toml"))


def _resolve(name: str, folder: Path, what: str) -> Path:
    path = Path(name)
    if path.suffix == ".toml":  # a file, not an id: say so when it is missing
        if path.exists():
            return path
        raise TopologyError(f"{what} file {name}: no such file; give an existing TOML file")
    path = folder / f"{name}.toml"
    if not path.exists():
        raise TopologyError(f"unknown {what} {name!r}; known: {', '.join(_ids(folder))}")
    return path


@cache
def load_server(name: str) -> ServerSpec:
    """Load a server by id (``dgx-h100``) or by path to a TOML file."""
    path = _resolve(name, SERVERS_DIR, "server")
    spec = _load(path, ServerSpec)
    net = spec.default_network  # a bad catalog id is refused with its file, whatever needs it
    if net is not None and Path(net).suffix != ".toml":
        try:
            load_network(net)
        except TopologyError as e:
            raise TopologyError(f"{path}: field 'default_network': {e}") from None
    elif net is not None and not Path(net).is_absolute() and (path.parent / net).is_file():
        # a path: from the server file's folder, where it is there (else the current folder)
        spec = spec.model_copy(update={"default_network": str(path.parent / net)})
    if spec.fabric == "mesh":  # a file wires every link (a scenario's cut may drop some)
        for gpu, n in enumerate(spec.mesh_links_per_gpu()):
            if n != spec.links_per_gpu:
                raise TopologyError(
                    f"{path}: GPU {gpu} has {n} links in mesh_edges (omitted: one to every "
                    f"peer), not links_per_gpu = {spec.links_per_gpu}; give each pair its "
                    "link count as [a, b, links]"
                )
    return spec


@cache
def load_network(name: str) -> NetworkSpec:
    """Load a network by id (``ib-ndr``) or by path to a TOML file."""
    return _load(_resolve(name, NETWORKS_DIR, "network"), NetworkSpec)


def list_servers() -> list[ServerSpec]:
    """Every server in the catalog, sorted by id."""
    return [load_server(i) for i in _ids(SERVERS_DIR)]


def list_networks() -> list[NetworkSpec]:
    """Every network in the catalog, sorted by id."""
    return [load_network(i) for i in _ids(NETWORKS_DIR)]


def load_cluster(
    server: str,
    *,
    gpus: int,
    network: str | None = None,
    oversubscription: float = 1.0,
    nodes_per_leaf: int = 32,
    degradations: tuple[Degradation, ...] = (),
) -> Cluster:
    """Build a cluster of ``ceil(gpus / gpus_per_node)`` nodes of one server type.

    Args:
        server: server id or TOML path.
        gpus: GPUs wanted; at least 1.
        network: network id; defaults to the server's compute NICs.
        oversubscription: fat-tree leaf down:up bandwidth ratio (1 = non-blocking).
        nodes_per_leaf: nodes under one leaf group, whose uplinks ``oversubscription`` thins.
        degradations: slower or missing links, each on a node and GPU of the cluster.
    """
    if gpus < 1:
        raise TopologyError(f"--gpus must be at least 1, got {gpus}")
    spec = load_server(server)
    nodes = math.ceil(gpus / spec.gpus_per_node)
    for d in degradations:
        _check_degradation(d, nodes, spec.gpus_per_node)
    if nodes > spec.max_nodes:
        raise TopologyError(
            f"--gpus {gpus} is more than {spec.id} clusters hold "
            f"({spec.max_nodes} nodes x {spec.gpus_per_node} GPUs); ask for fewer GPUs"
        )
    if gpus > MAX_GPUS:  # every rank is walked: 2^20 take about a second, 1e8 took minutes
        raise TopologyError(f"--gpus {gpus}: at most {MAX_GPUS:,} GPUs are modelled; ask for fewer")
    return Cluster(
        ClusterSpec(
            server=spec,
            network=_network(spec, network, gpus=gpus, nodes=nodes),
            num_nodes=nodes,
            oversubscription=oversubscription,
            nodes_per_leaf=nodes_per_leaf,
            degradations=degradations,
        )
    )


def _network(spec: ServerSpec, network: str | None, *, gpus: int, nodes: int) -> NetworkSpec | None:
    """The network joining ``nodes`` servers: ``network``, else the server's own compute NICs
    (none for one node of a server without them); a `TopologyError` when several need one."""
    net_id = network or spec.default_network
    net = load_network(net_id) if net_id else None
    if nodes > 1 and spec.nics_per_node == 0:  # a --network cannot help: there is no NIC
        raise TopologyError(
            f"{spec.id} has no compute NICs (nics_per_node = 0), so {gpus} GPUs on {nodes} "
            f"nodes cannot talk; use --gpus {spec.gpus_per_node} or fewer, or set nics_per_node"
        )
    if nodes > 1 and net is None:
        raise TopologyError(
            f"{spec.id} names no network; {gpus} GPUs need {nodes} nodes: pass --network"
        )
    return net


def _check_degradation(d: Degradation, nodes: int, gpus_per_node: int) -> None:
    """A `TopologyError` unless ``d`` names a node and GPU the cluster has (or ``*``)."""
    for what, index, count in (("NODE", d.node, nodes), ("GPU", d.local_rank, gpus_per_node)):
        if index is not None and index >= count:
            text = ":".join("*" if x is None else str(x) for x in (d.tier, d.node, d.local_rank))
            raise TopologyError(
                f"--degrade {text}:{d.bw_scale:g}: {what} {index} is outside this cluster; "
                f"use 0..{count - 1} or *"
            )
