"""An all-to-all on a mesh node fabric drains over each pair's own links, not the group's rings.

collectives.md section 2: a direct all-to-all sends (n-1)/n S per rank, "per-pair bandwidth
matters on non-switched fabrics". Each GPU sends S/n to every peer at once; to a peer joined by
``l`` NVLinks that takes ``S/n / (l x 25 GB/s x eff)``, and the peers with no NVLink share the
GPU's one PCIe path. Before, the mesh all-to-all ran at the ring rate of the group: on the
DGX-1 V100's eight GPUs (three peers each over PCIe 3.0 x16) 1 GiB took 7.86 ms, not 31.5 ms.
"""

from __future__ import annotations

import itertools

import pytest

from topologies import collective_estimate
from topologies.catalog import load_cluster

S = 2.0**30
NVLINK2_LINK = 25e9  # bytes/s per direction of one NVLink2 link
PCIE3_X16 = 16e9  # bytes/s per direction
EFFICIENCY = 0.80  # the DGX-1 intra tier's efficiency
HOST_EFFICIENCY = 0.76  # its PCIe 3.0 host path's (NCCL's Gen3 x16 figure)


def _a2a_data_s(server: str, ranks: tuple[int, ...], gpus: int = 8) -> float:
    """The all-to-all's time less its launch and per-step latencies (Simple wins at 1 GiB)."""
    c = load_cluster(server, gpus=gpus)
    g = c.group_links(ranks)
    est = collective_estimate("all-to-all", S, ranks, c)
    assert (est.algorithm, est.protocol) == ("direct", "simple")
    steps = (g.ranks_per_node - 1) * g.intra_latency_s + (g.num_nodes - 1) * g.inter_latency_s
    return est.time_s - g.launch_latency_s - steps


@pytest.mark.parametrize(
    ("ranks", "want_s"),
    [
        # GPU 0's peers 5, 6, 7 have no NVLink: 3 x S/8 over one x16 link, the bound
        (tuple(range(8)), 3 * S / 8 / (PCIE3_X16 * HOST_EFFICIENCY)),
        # quad {0,1,2,3}: every GPU has a peer on a single link: S/4 over one link
        ((0, 1, 2, 3), S / 4 / (NVLINK2_LINK * EFFICIENCY)),
        # a pair on 2 links, a pair on 1, a pair on none (PCIe): S/2 over what joins them
        ((0, 4), S / 2 / (2 * NVLINK2_LINK * EFFICIENCY)),
        ((0, 1), S / 2 / (NVLINK2_LINK * EFFICIENCY)),
        ((0, 5), S / 2 / (PCIE3_X16 * HOST_EFFICIENCY)),
        # {0,1,5}: 0-1 and 1-5 linked, 0-5 over PCIe: S/3 over the slowest, PCIe
        ((0, 1, 5), S / 3 / (PCIE3_X16 * HOST_EFFICIENCY)),
    ],
)
def test_dgx1_all_to_all_is_bound_by_its_slowest_pair(
    ranks: tuple[int, ...], want_s: float
) -> None:
    assert _a2a_data_s("dgx1-v100", ranks) == pytest.approx(want_s, rel=1e-12)


def test_full_mesh_all_to_all_equals_the_ring_rate() -> None:
    """MI300X, one xGMI link a pair: each of k - 1 peers gets one link, which is the rings'
    k - 1 links of 7, so the all-to-all's numbers are those of the ring rate, as before."""
    c = load_cluster("amd-mi300x-platform", gpus=8)
    for k in range(2, 9):
        for ranks in itertools.combinations(range(8), k):
            g = c.group_links(ranks)
            assert g.a2a_intra_bw_bytes_per_s == g.intra_bw_bytes_per_s
            want = (k - 1) / k * S / g.intra_bw_bytes_per_s
            assert _a2a_data_s("amd-mi300x-platform", ranks) == pytest.approx(want, rel=1e-12)


def test_switch_fabrics_keep_the_gpu_link_rate() -> None:
    """NVSwitch and PCIe: one link per GPU carries all its peers' shares; no mesh rate."""
    for server in ("dgx-h100", "pcie-h100-8gpu"):
        g = load_cluster(server, gpus=8).group_links(range(8))
        assert g.a2a_intra_bw_bytes_per_s is None
        want = 7 / 8 * S / g.intra_bw_bytes_per_s
        assert _a2a_data_s(server, tuple(range(8))) == pytest.approx(want, rel=1e-12)
