"""A GPU's way to the network: the NIC it uses, that NIC's degradation, and its rate.

GPUs share NICs evenly and in order (DGX-1 V100 and the PCIe servers: GPUs 2i and 2i + 1 behind
NIC i, on one PCIe switch); with more NICs than GPUs each GPU has ``nics / gpus`` of its own.
All GPUs are taken to send at once (every rank of a layout runs its group's collective), so a
GPU gets its share of its NIC. A NIC hangs off PCIe, so it is no faster than its x16 link; a
GPU reaches it over its own x16 link (GPUDirect RDMA; on a PCIe server the one link that carries
its peer traffic too). A node cut to fewer GPUs keeps the server's GPUs per NIC (`nics_kept`).
Degradations: ``inter`` scales the NIC the named GPU uses, ``intra`` the GPU's fabric link (on
a PCIe server its x16 link).
"""

from __future__ import annotations

from topologies.spec import MIN_BW_SCALE, ClusterSpec, ServerSpec, TierKind, TopologyError


def link_scale(spec: ClusterSpec, tier: TierKind, node: int, local: int) -> float:
    """Product of the degradations of GPU ``local``'s link on ``tier`` (its own, not a NIC's),
    at least `MIN_BW_SCALE`."""
    scale = 1.0
    for d in spec.degradations:
        if d.tier == tier and d.node in (None, node) and d.local_rank in (None, local):
            scale *= d.bw_scale
    return max(scale, MIN_BW_SCALE)


def nic_of(server: ServerSpec, local: int) -> int:
    """The NIC a GPU reaches the network by (GPUs sharing one: ``gpus / nics`` a NIC, in
    order), or with several NICs a GPU, the GPU's own index (its NICs are ``nics / gpus``)."""
    return local * min(server.nics_per_node, server.gpus_per_node) // server.gpus_per_node


def nic_scale(spec: ClusterSpec, node: int, local: int) -> float:
    """Degradation of the NIC GPU ``local`` uses: ``inter:NODE:GPU:SCALE`` scales the NIC that
    GPU reaches the network by, so every GPU sharing it slows too (flags naming the same NIC
    multiply, as flags on one link do, down to `MIN_BW_SCALE`)."""
    scale, mine = 1.0, nic_of(spec.server, local)
    for d in spec.degradations:
        named = d.local_rank is None or nic_of(spec.server, d.local_rank) == mine
        if d.tier == "inter" and d.node in (None, node) and named:
            scale *= d.bw_scale
    return max(scale, MIN_BW_SCALE)


def pcie_link(server: ServerSpec) -> tuple[float, float] | None:
    """A GPU's PCIe x16 link where the server file gives one, as (line rate one direction,
    efficiency): the GPU's one link on a PCIe server, its ``[pcie]`` link on an NVSwitch or
    mesh server, else a mesh's host path (DGX-1: PCIe 3.0, at its ``host_efficiency``). A NIC's
    own link to its PCIe switch is taken to be as fast. None where none is filed: the NIC is
    then not capped by PCIe."""
    if server.fabric == "pcie":
        return server.intra.bw_bytes_per_s_per_dir, server.intra.efficiency
    if server.pcie is not None:
        return server.pcie.bw_bytes_per_s_per_dir, server.pcie.efficiency
    return server.host_path


def pcie_bw(server: ServerSpec) -> float | None:
    """The achieved rate, one direction, of the GPU's PCIe x16 link (`pcie_link`)."""
    link = pcie_link(server)
    return None if link is None else link[0] * link[1]


def pcie_line_bw(server: ServerSpec) -> float | None:
    """The line rate, one direction, of the GPU's PCIe x16 link (`pcie_link`)."""
    link = pcie_link(server)
    return None if link is None else link[0]


def nics_kept(server: ServerSpec, gpus: int) -> int:
    """NICs a node of ``server`` cut (or grown) to ``gpus`` GPUs has: each GPU keeps the NIC its
    PCIe switch joins it to, so the server's GPUs per NIC hold (DGX-1, 2 a NIC: 4 GPUs keep 2
    NICs, not 4), or with several NICs a GPU, its NICs per GPU. A `TopologyError` when the GPUs
    would fill a NIC only in part (3 GPUs at 2 a NIC: one NIC shared, one not), as GPUs share
    NICs evenly here."""
    nics, have = server.nics_per_node, server.gpus_per_node
    if nics == 0:
        return 0
    if nics >= have:
        return gpus * (nics // have)
    per_nic = have // nics
    if gpus % per_nic:
        raise TopologyError(
            f"gpus_per_node = {gpus} on {server.id} would share a NIC unevenly (its GPUs share "
            f"NICs {per_nic} a NIC); use a multiple of {per_nic}, or set nics_per_node too"
        )
    return gpus // per_nic


def gpu_inter_bw(spec: ClusterSpec, node: int, local: int) -> float:
    """Network bandwidth one GPU gets, effective, one direction, all GPUs sending at once: its
    share (``nics / gpus``) of the NIC it uses, that NIC at the lesser of its port rate and its
    PCIe link (shared by the GPUs behind it), and no more than the GPU's own PCIe link
    carries (on a PCIe server scaled by its ``intra`` degradation: it is that link)."""
    if spec.network is None:
        return 0.0
    srv, pcie = spec.server, pcie_bw(spec.server)
    nic = spec.network.link.effective_bw_bytes_per_s * nic_scale(spec, node, local)
    if pcie is not None:
        nic = min(nic, pcie)
    bw = nic * srv.nics_per_node / srv.gpus_per_node
    if pcie is not None:
        own = link_scale(spec, "intra", node, local) if srv.fabric == "pcie" else 1.0
        bw = min(bw, pcie * own)
    return bw
