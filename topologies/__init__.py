"""Cluster topologies and collective-communication cost models.

Contract: topologies answers "which ranks share which link, at what bandwidth and latency, and
how long does a collective over them take?". Inputs are catalog ids (servers, networks: TOML
files in ``topologies/data``), GPU counts, rank groups and message sizes in bytes; outputs are
SI values (seconds, bytes/s per direction). It imports nothing from the project's other packages.
"""

from topologies.catalog import (
    list_networks,
    list_servers,
    load_cluster,
    load_network,
    load_server,
)
from topologies.cluster import MEGATRON_ORDER, Cluster, GroupLinks
from topologies.collectives import (
    ALGORITHMS,
    OPS,
    CollectiveEstimate,
    busbw_factor,
    collective_estimate,
    collective_time_s,
    ring_bytes_per_rank,
)
from topologies.nics import nics_kept
from topologies.spec import (
    ClusterSpec,
    Degradation,
    LinkTier,
    NetworkSpec,
    NVLSSpec,
    PCIeSpec,
    ServerSpec,
    TopologyError,
)

__all__ = [
    "ALGORITHMS",
    "MEGATRON_ORDER",
    "OPS",
    "Cluster",
    "ClusterSpec",
    "CollectiveEstimate",
    "Degradation",
    "GroupLinks",
    "LinkTier",
    "NVLSSpec",
    "NetworkSpec",
    "PCIeSpec",
    "ServerSpec",
    "TopologyError",
    "busbw_factor",
    "collective_estimate",
    "collective_time_s",
    "list_networks",
    "list_servers",
    "load_cluster",
    "load_network",
    "load_server",
    "nics_kept",
    "ring_bytes_per_rank",
]
