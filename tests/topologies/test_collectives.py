from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topologies import (
    OPS,
    Degradation,
    TopologyError,
    collective_estimate,
    collective_time_s,
    load_cluster,
    ring_bytes_per_rank,
)
from topologies.algorithms import ring
from topologies.cluster import GroupLinks


def _links(n: int, bw: float, *, latency_s: float = 0.0) -> GroupLinks:
    return GroupLinks(
        size=n, num_nodes=1, ranks_per_node=n, intra_bw_bytes_per_s=bw,
        intra_line_bw_bytes_per_s=bw, intra_latency_s=latency_s, inter_bw_bytes_per_s=0.0,
        inter_latency_s=0.0, launch_latency_s=0.0, nvls=None,
    )  # fmt: skip


@pytest.mark.parametrize("p", [2, 3, 8, 64])
def test_ring_all_reduce_bytes_per_rank(p: int) -> None:
    assert ring_bytes_per_rank("all-reduce", 1e9, p) == pytest.approx(2 * (p - 1) / p * 1e9)
    assert ring_bytes_per_rank("all-gather", 1e9, p) == pytest.approx((p - 1) / p * 1e9)
    (phase,) = ring("all-reduce", 1e9, _links(p, 1e11, latency_s=1e-6)) or []
    assert phase.wire_bytes == pytest.approx(2 * (p - 1) / p * 1e9)
    assert phase.latency_s == pytest.approx(2 * (p - 1) * 1e-6)  # 2(p-1) alpha


def test_one_rank_is_free() -> None:
    c = load_cluster("dgx-h100", gpus=8)
    for op in OPS:
        assert collective_time_s(op, 1e9, [5], c) == 0.0


def test_busbw_targets_single_node() -> None:
    h100 = load_cluster("dgx-h100", gpus=8)
    nvls = collective_estimate("all-reduce", 8 * 2**30, range(8), h100)
    ring8 = collective_estimate("all-reduce", 8 * 2**30, range(8), h100, algorithm="ring")
    assert nvls.algorithm == "nvls"
    assert nvls.busbw_bytes_per_s / 1e9 == pytest.approx(479, rel=0.15)
    assert ring8.busbw_bytes_per_s / 1e9 == pytest.approx(370, rel=0.15)
    a100 = collective_estimate("all-reduce", 8 * 2**30, range(8), load_cluster("dgx-a100", gpus=8))
    assert a100.busbw_bytes_per_s / 1e9 == pytest.approx(231, rel=0.15)


def test_auto_is_the_fastest() -> None:
    c = load_cluster("dgx-h100", gpus=32)
    for op in OPS:
        for nbytes in (1e3, 1e6, 1e9):
            best = collective_time_s(op, nbytes, range(32), c)
            for algo in ("ring", "tree", "nvls", "hierarchical", "direct"):
                try:
                    t = collective_time_s(op, nbytes, range(32), c, algorithm=algo)
                except TopologyError:
                    continue
                assert best <= t * (1 + 1e-12)


def test_multi_node_ring_is_nic_bound() -> None:
    # 4 nodes x 8 A100: ring busbw about min(8 x 24, intra) = 190 GB/s (collectives.md 5.4)
    c = load_cluster("dgx-a100", gpus=32)
    est = collective_estimate("all-reduce", 8 * 2**30, range(32), c, algorithm="ring")
    assert est.busbw_bytes_per_s / 1e9 == pytest.approx(190, rel=0.15)


def test_degraded_links_are_slower() -> None:
    size, ranks = 1e9, range(16)
    base = load_cluster("dgx-h100", gpus=16)
    slow_nic = Degradation(tier="inter", node=1, local_rank=3, bw_scale=0.5)
    missing_nvlink = Degradation(tier="intra", node=0, local_rank=0, bw_scale=17 / 18)
    t0 = collective_time_s("all-reduce", size, ranks, base, algorithm="ring")
    for d in (slow_nic, missing_nvlink):
        c = load_cluster("dgx-h100", gpus=16, degradations=(d,))
        assert collective_time_s("all-reduce", size, ranks, c, algorithm="ring") > t0
    slower_net = load_cluster("dgx-h100", gpus=16, network="ib-hdr")
    assert collective_time_s("all-reduce", size, ranks, slower_net) > collective_time_s(
        "all-reduce", size, ranks, base
    )


def test_inapplicable_algorithm() -> None:
    c = load_cluster("dgx-a100", gpus=8)
    with pytest.raises(TopologyError, match="does not apply"):
        collective_time_s("all-reduce", 1e6, range(8), c, algorithm="nvls")
    with pytest.raises(TopologyError, match="positive"):
        collective_time_s("all-reduce", -1, range(8), c)


def test_send_recv_and_all_to_all() -> None:
    c = load_cluster("dgx-h100", gpus=16)
    intra = collective_time_s("send-recv", 1e8, [0, 1], c)
    inter = collective_time_s("send-recv", 1e8, [0, 8], c)
    assert inter > intra > 0
    assert collective_estimate("all-to-all", 1e8, range(16), c).algorithm == "direct"


@settings(max_examples=60, deadline=None)
@given(
    op=st.sampled_from(OPS),
    n=st.integers(min_value=1, max_value=24),
    nbytes=st.floats(min_value=1.0, max_value=1e10),
    bw=st.floats(min_value=1e9, max_value=1e12),
    factor=st.floats(min_value=1.0, max_value=100.0),
    alg=st.sampled_from(["ring", "tree", "direct"]),
)
def test_time_monotone(op: str, n: int, nbytes: float, bw: float, factor: float, alg: str) -> None:
    from topologies.collectives import PROTOCOLS, _phases_s

    slow, fast = _links(n, bw, latency_s=1e-6), _links(n, bw * factor, latency_s=1e-6)
    if n == 1:
        return
    from topologies.algorithms import ALGORITHMS

    ps_slow, ps_fast = ALGORITHMS[alg](op, nbytes, slow), ALGORITHMS[alg](op, nbytes, fast)  # type: ignore[arg-type]
    ps_big = ALGORITHMS[alg](op, nbytes * factor, slow)  # type: ignore[arg-type]
    if ps_slow is None or ps_fast is None or ps_big is None:
        return
    for proto in PROTOCOLS.values():
        t = _phases_s(ps_slow, proto)
        assert _phases_s(ps_fast, proto) <= t * (1 + 1e-12)  # non-increasing in bandwidth
        assert _phases_s(ps_big, proto) >= t * (1 - 1e-12)  # non-decreasing in bytes


@settings(max_examples=40, deadline=None)
@given(
    gpus=st.integers(min_value=1, max_value=64),
    nbytes=st.floats(min_value=1.0, max_value=1e10),
    scale=st.floats(min_value=0.05, max_value=1.0),
)
def test_cluster_time_monotone_in_nic_bandwidth(gpus: int, nbytes: float, scale: float) -> None:
    fast = load_cluster("dgx-h100", gpus=gpus)
    slow = load_cluster(
        "dgx-h100", gpus=gpus, degradations=(Degradation(tier="inter", bw_scale=scale),)
    )
    t_fast = collective_time_s("all-reduce", nbytes, range(gpus), fast)
    t_slow = collective_time_s("all-reduce", nbytes, range(gpus), slow)
    assert t_fast <= t_slow * (1 + 1e-12)
    assert math.isfinite(t_slow)
    assert collective_time_s("all-reduce", nbytes * 2, range(gpus), fast) >= t_fast
