"""Typed specifications of link tiers, servers, networks and clusters (SI units, per direction).

Every bandwidth is bytes per second in ONE direction (vendors quote NVLink as both directions
summed: H100 "900 GB/s" is 450 GB/s each way). ``efficiency`` is the fraction of that line rate
a ring collective achieves (its bus bandwidth), fitted to a measured figure named in the file
that carries it.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

Fabric = Literal["nvswitch", "mesh", "pcie"]
TierKind = Literal["intra", "inter"]
# a file's numbers must be numbers: pydantic's lax mode read gpus_per_node = "8" as 8 and an
# efficiency of true as 1.0; strict ints refuse floats too (gpus_per_node = 8.5)
_Int = Annotated[int, Strict()]
_Float = Annotated[float, Strict()]
# finite is not enough: 1.7e308 B/s summed over NICs overflowed to inf (an all-to-all divided by
# zero), 1e-300 B/s priced a collective at inf s, a latency of 1e9 s printed a 4e11 ms step.
# No link is slower than 1 MB/s or faster than 1 PB/s a direction (NVLink 5: 9e11), and no
# step, switch round or launch takes a second; an efficiency under 1% is no fitted figure.
_Rate = Annotated[_Float, Field(ge=1e6, le=1e15)]
_Latency = Annotated[_Float, Field(ge=0, le=1.0)]
_Efficiency = Annotated[_Float, Field(ge=0.01, le=1)]
# Leaf down:up ratios in deployed fat trees run 1:1 to about 8:1; past 64:1 a leaf's uplinks
# are no fabric (1e300 printed a 300-digit step time, inf crashed the scenario check).
MAX_OVERSUBSCRIPTION = 64.0
# The least share of its rate a degraded link keeps, one flag's or the product of several
# (110 flags of 0.001 on one link multiplied to 0: a collective of Infinity seconds).
MIN_BW_SCALE = 1e-3
MAX_NICS_PER_NODE = 1024  # a GB200 NVL72 rack as one node has 72; 1e20 passed as "a multiple"


class TopologyError(ValueError):
    """Bad topology input (unknown id, impossible size, bad file): the message names the fix."""


class _Frozen(BaseModel):
    # finite: a rate or latency of inf priced collectives at 0 s or Infinity (NaN steps)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class LinkTier(_Frozen):
    """One class of link a GPU uses: NVLink into a switch, a PCIe switch, or a NIC port."""

    name: str
    bw_bytes_per_s_per_dir: _Rate = Field(description="line rate, one direction")
    latency_s: _Latency = Field(description="per algorithm step, Simple protocol")
    efficiency: _Efficiency = Field(description="achieved ring busbw / line rate")

    @property
    def effective_bw_bytes_per_s(self) -> float:
        """Bandwidth a ring achieves on this tier, per direction."""
        return self.bw_bytes_per_s_per_dir * self.efficiency


class NVLSSpec(_Frozen):
    """NVLink SHARP (in-switch reduction and multicast) on NVSwitch gen3+ fabrics."""

    latency_s: _Latency = Field(
        description="fixed cost of one NVLS call (NCCL's NVLS NVLink latency, no base)"
    )
    fill_depth_s: _Latency = Field(
        description="chunk-pipeline depth of one switch round (mid-size ramp), <= latency_s"
    )
    efficiency: _Efficiency = Field(description="achieved algbw / per-GPU line rate")

    @model_validator(mode="after")
    def _depth_fits(self) -> NVLSSpec:
        """A chunk's fill depth is part of the call's latency, never more."""
        if self.fill_depth_s > self.latency_s:
            raise ValueError(
                f"fill_depth_s = {self.fill_depth_s} must be at most latency_s = "
                f"{self.latency_s} (the depth is part of the latency); fix either"
            )
        return self


class PCIeSpec(_Frozen):
    """A GPU's PCIe x16 link where the node fabric is not PCIe: its NIC's traffic crosses it
    (GPUDirect RDMA), so no NIC serves a GPU faster, and a NIC's own x16 link is as fast."""

    bw_bytes_per_s_per_dir: _Rate = Field(description="x16 line rate, one direction")
    efficiency: _Efficiency = Field(description="achieved rate / line rate")

    @property
    def effective_bw_bytes_per_s(self) -> float:
        """Rate achieved over the link, one direction."""
        return self.bw_bytes_per_s_per_dir * self.efficiency


class ServerSpec(_Frozen):
    """One server (OS node): GPUs, the fabric joining them, and its NICs."""

    id: str
    name: str
    gpu: str = Field(description="gpu id as in shared/data/hardware/gpus.json")
    gpus_per_node: _Int = Field(gt=0)
    fabric: Fabric
    links_per_gpu: _Int = Field(gt=0, description="NVLink/xGMI links (1 for PCIe)")
    mesh_edges: tuple[tuple[_Int, _Int] | tuple[_Int, _Int, _Int], ...] | None = Field(
        default=None,
        description="GPU pairs joined on a mesh fabric, [a, b] (one link) or [a, b, links]; "
        "None = every pair, one link each",
    )
    host_bw_bytes_per_s_per_dir: _Rate | None = Field(
        default=None,
        description="a GPU's PCIe path to the host, one direction: what a ring between mesh "
        "GPUs with no direct link gets",
    )
    host_efficiency: _Efficiency | None = Field(
        default=None,
        description="achieved rate / line rate of that PCIe path (default: the [intra] tier's)",
    )
    launch_latency_s: _Latency = Field(description="fixed cost of one collective call")
    intra: LinkTier = Field(description="per-GPU bandwidth a ring can use inside the node")
    nvls: NVLSSpec | None = None
    pcie: PCIeSpec | None = Field(
        default=None,
        description="a GPU's PCIe x16 link to its NIC on an NVSwitch or mesh fabric (on a PCIe "
        "fabric `intra` is that link); None: not on file, the NIC is not capped by it",
    )
    nics_per_node: _Int = Field(ge=0, le=MAX_NICS_PER_NODE)
    default_network: str | None = Field(description="network id of the compute NICs")
    max_nodes: _Int = Field(gt=0, description="largest vetted scale-out fabric for this server")
    sources: tuple[str, ...] = ()

    @property
    def host_path(self) -> tuple[float, float] | None:
        """The mesh's host path (``host_bw_bytes_per_s_per_dir``) as (line rate one
        direction, efficiency: ``host_efficiency``, else the [intra] tier's); None if none."""
        if self.host_bw_bytes_per_s_per_dir is None:
            return None
        eff = self.host_efficiency or self.intra.efficiency
        return self.host_bw_bytes_per_s_per_dir, eff

    @property
    def host_intra_equivalent_bytes_per_s(self) -> float:
        """The host path's rate in the unit mesh shares of the [intra] line rate are read in
        (they are priced at the [intra] efficiency): its achieved rate over that efficiency;
        0.0 without a host path."""
        path = self.host_path
        return 0.0 if path is None else path[0] * path[1] / self.intra.efficiency

    @model_validator(mode="after")
    def _parts_fit(self) -> ServerSpec:
        """NICs shared evenly, NVLS only on an NVSwitch, [pcie] only off a PCIe fabric, a mesh's
        links as `_mesh_fits` asks."""
        gpus, nics = self.gpus_per_node, self.nics_per_node
        if nics and gpus % nics and nics % gpus:
            raise ValueError(
                f"nics_per_node = {nics} must divide gpus_per_node = {gpus} or be a multiple "
                "of it (GPUs share NICs evenly); fix nics_per_node"
            )
        if self.nvls is not None and self.fabric != "nvswitch":
            raise ValueError(
                f'[nvls] needs fabric = "nvswitch" (NVLink SHARP runs in the switch), not '
                f"{self.fabric!r}; remove [nvls] or fix fabric"
            )
        if self.pcie is not None and self.fabric == "pcie":
            raise ValueError(
                '[pcie] is read only off a PCIe fabric: on fabric = "pcie" the [intra] tier is '
                "the GPU's x16 link; remove [pcie]"
            )
        if self.fabric == "mesh":
            self._mesh_fits()
        for key in ("mesh_edges", "host_bw_bytes_per_s_per_dir", "host_efficiency"):
            if self.fabric != "mesh" and getattr(self, key) is not None:
                raise ValueError(
                    f'{key} is read only on fabric = "mesh" (GPUs joined by direct links); '
                    "remove it or fix fabric"
                )
        return self

    def pair_links(self) -> dict[tuple[int, int], int]:
        """Links joining each GPU pair ``(a, b)``, ``a < b``, of a mesh; a pair with none is
        absent. ``mesh_edges`` None: every pair, one link each."""
        if self.mesh_edges is None:
            return dict.fromkeys(itertools.combinations(range(self.gpus_per_node), 2), 1)
        return {(min(e[:2]), max(e[:2])): e[2] if len(e) == 3 else 1 for e in self.mesh_edges}

    def mesh_links_per_gpu(self) -> list[int]:
        """Links each GPU of a mesh has in ``mesh_edges`` (index = GPU)."""
        total = [0] * self.gpus_per_node
        for (a, b), n in self.pair_links().items():
            total[a] += n
            total[b] += n
        return total

    def _mesh_fits(self) -> None:
        """Pairs of two of its GPUs, each listed once with at least one link; no GPU with more
        links than ``links_per_gpu``; a host path where some pair has no link, and where its
        efficiency is given."""
        gpus, seen = self.gpus_per_node, set()
        for e in self.mesh_edges or ():
            a, b = e[:2]
            if a == b or not (0 <= a < gpus and 0 <= b < gpus):
                raise ValueError(
                    f"mesh_edges pair [{a}, {b}] must join two different GPUs of "
                    f"0..{gpus - 1}; fix mesh_edges"
                )
            if len(e) == 3 and e[2] < 1:
                raise ValueError(
                    f"mesh_edges entry {list(e)}: a pair has at least 1 link; drop the pair "
                    "if no link joins it"
                )
            if (min(a, b), max(a, b)) in seen:
                raise ValueError(f"mesh_edges lists the pair [{a}, {b}] twice; list it once")
            seen.add((min(a, b), max(a, b)))
        for gpu, n in enumerate(self.mesh_links_per_gpu()):
            if n > self.links_per_gpu:
                raise ValueError(
                    f"GPU {gpu} has {n} links in mesh_edges (omitted: one to every peer), "
                    f"more than links_per_gpu = {self.links_per_gpu}; fix the link counts "
                    "([a, b, links]) or links_per_gpu"
                )
        unlinked = set(itertools.combinations(range(gpus), 2)) - set(self.pair_links())
        if unlinked and self.host_bw_bytes_per_s_per_dir is None:
            a, b = min(unlinked)
            raise ValueError(
                f"mesh_edges joins GPUs {a} and {b} by no link, so a ring between them takes the "
                "host path; give host_bw_bytes_per_s_per_dir (a GPU's PCIe rate, one direction)"
            )
        if self.host_efficiency is not None and self.host_bw_bytes_per_s_per_dir is None:
            raise ValueError(
                "host_efficiency prices the host path, and this mesh has none: give "
                "host_bw_bytes_per_s_per_dir (a GPU's PCIe rate, one direction) or remove "
                "host_efficiency"
            )


class NetworkSpec(_Frozen):
    """A scale-out network: one NIC port's rate and the achievable fraction of it."""

    id: str
    name: str
    kind: Literal["infiniband", "roce"]
    link: LinkTier
    sources: tuple[str, ...] = ()


class Degradation(_Frozen):
    """A slower or missing link: scale one GPU's (or every GPU's) link on one tier.

    ``intra``: the GPU's link into the node fabric (NVLink; on a PCIe server its x16 link, which
    its NIC traffic crosses too). ``inter``: the NIC the GPU reaches the network by, so every
    GPU sharing that NIC slows. ``bw_scale`` 0.5 is a NIC at half rate; a missing NVLink of 18
    is ``(18 - 1) / 18``. ``local_rank`` None applies to every GPU of the node (or node None:
    of the cluster).
    """

    tier: TierKind
    node: int | None = Field(default=None, ge=0)
    local_rank: int | None = Field(default=None, ge=0)
    # 1e-320 priced a collective at inf s; a link at 0.1% of its rate is degraded enough
    bw_scale: float = Field(ge=MIN_BW_SCALE, le=1)


class ClusterSpec(_Frozen):
    """Nodes of one server type joined by a rail-optimised fat tree."""

    server: ServerSpec
    network: NetworkSpec | None
    num_nodes: int = Field(gt=0)
    nodes_per_leaf: int = Field(default=32, gt=0, description="nodes under one leaf group (SU)")
    oversubscription: float = Field(
        default=1.0, ge=1, le=MAX_OVERSUBSCRIPTION, description="leaf down:up bandwidth"
    )
    degradations: tuple[Degradation, ...] = ()

    @property
    def world_size(self) -> int:
        """Number of GPUs in the cluster."""
        return self.num_nodes * self.server.gpus_per_node
