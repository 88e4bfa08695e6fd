"""Rings on a mesh node fabric (GPUs joined by direct links, no switch).

On a mesh a GPU reaches a peer only over the links joining the two (DGX-1 V100: NVLink2
hybrid cube-mesh, 1 or 2 links a pair and none between some; MI300X: one xGMI link to each of
its 7 peers), so a rank group that holds only some of a node's GPUs can keep busy only the
links among them. NCCL runs several channels, each a ring over the group's GPUs; channels may
share a link, so rings run at fractional rates. What a group gets, per GPU and direction, is
the largest total rate of rings (Hamiltonian cycles over its GPUs, each hop on a direct link)
whose load on no link direction exceeds that link's rate: a small linear program, solved once
per set of GPUs. A cycle run both ways loads each of its links once per direction, and any
packing of directed rings averaged with its reverse is one of those, so the rate is twice the
largest fractional packing of undirected cycles. Two GPUs: a ring of two uses every link
joining them. Upper bound: the fewest links any GPU has to the others of the group.

An all-to-all is no ring: each GPU sends its share to every peer at once, each over the links
joining the two (`all_to_all_share`), so the slowest pair, or the host path that the peers with
no link share, bounds it (collectives.md section 2: per-pair bandwidth matters off a switch).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from fractions import Fraction
from functools import cache

from topologies.spec import ServerSpec

Edges = tuple[tuple[tuple[int, int], int], ...]


def group_share(server: ServerSpec, local_sets: Iterable[Iterable[int]]) -> float:
    """Fraction of a mesh GPU's line rate (``intra.bw_bytes_per_s_per_dir``, all its links)
    that rings over a group get: on each node, rings over the group's GPUs there; the least
    over nodes that hold two or more of them, 0 when none does (no in-node traffic).

    A node whose GPUs have no ring over direct links (DGX-1 GPUs 0 and 5: SYS in
    ``nvidia-smi topo -m``, no NVLink; NCCL routes through no GPU outside the group) falls back
    to the host path: every hop at most ``host_bw_bytes_per_s_per_dir`` (one PCIe x16 link a
    direction) at ``host_efficiency``. That is an upper bound, not a measurement: the DGX-1
    path also crosses QPI and NCCL stages it through host memory. Rings that mix direct links
    and the host path are not summed with the direct ones: the larger of the two rates is
    taken.
    """
    edges: Edges = tuple(sorted(server.pair_links().items()))
    host = server.host_intra_equivalent_bytes_per_s / server.intra.bw_bytes_per_s_per_dir
    shares = []
    for gpus in local_sets:
        group = tuple(sorted(gpus))
        if len(group) > 1:
            links = ring_links(group, edges)
            shares.append(max(links / server.links_per_gpu, host))
    return min(shares, default=0.0)


def all_to_all_share(server: ServerSpec, local_sets: Iterable[Iterable[int]], ppn: int) -> float:
    """Fraction of a mesh GPU's line rate at which an all-to-all drains its in-node traffic.

    Each GPU sends b bytes to every other GPU of the group on its node, all at once: to a peer
    joined by ``l`` links in ``b / (l x line / links_per_gpu)``, to the ``u`` peers with none
    over the one host path in ``u x b / host``, so the node takes ``b x T / line`` with T the
    largest of ``links_per_gpu / l`` and ``u x line / host`` over its GPUs and peers. The
    all-to-all prices ``(ppn - 1) x b`` at ``share x line``, ``ppn`` the most ranks on any
    node, so ``share = (ppn - 1) / T`` of the slowest node; 0 when no node holds two ranks.
    A full mesh (one link to each of k - 1 peers) gives ``(k - 1) / links_per_gpu``, its ring
    share; the DGX-1's eight GPUs, three peers each on the host path, ``7 / 28.1``, not 1.
    """
    line = server.intra.bw_bytes_per_s_per_dir
    host = server.host_intra_equivalent_bytes_per_s
    links = server.pair_links()
    worst = 0.0
    for gpus in local_sets:
        group = sorted(gpus)
        for g in group:
            peers = [links.get((min(g, p), max(g, p)), 0) for p in group if p != g]
            linked = [server.links_per_gpu / n for n in peers if n]
            unlinked = len(peers) - len(linked)
            worst = max(worst, *linked, unlinked * line / host if unlinked else 0.0)
    return (ppn - 1) / worst if worst > 0 else 0.0


@cache
def ring_links(gpus: tuple[int, ...], edges: Edges) -> float:
    """Links per GPU, one direction, that rings over ``gpus`` (sorted) keep busy.

    ``edges`` are ``((a, b), links)`` pairs of the whole node; only those inside the group
    count. The linear program's optimum is rational; it is snapped to the nearest fraction
    with denominator at most 1000 (within 1e-9 of it when the true one is that simple), so the
    same inputs give the same float on every machine and a full mesh of 8 gives exactly 7.
    """
    inside = {p: n for p, n in edges if p[0] in gpus and p[1] in gpus}
    if len(gpus) < 2:
        return 0.0
    if len(gpus) == 2:
        return float(inside.get((gpus[0], gpus[1]), 0))
    cycles = _hamiltonian_cycles(gpus, set(inside))
    if not cycles:
        return 0.0
    packing = _max_packing(cycles, inside)
    return float(2 * Fraction(packing).limit_denominator(1000))


def _hamiltonian_cycles(
    gpus: tuple[int, ...], pairs: set[tuple[int, int]]
) -> list[list[tuple[int, int]]]:
    """Every cycle through all of ``gpus`` on ``pairs``, once per direction pair, as edges."""
    first, rest = gpus[0], gpus[1:]
    found = []
    for order in itertools.permutations(rest):
        if order[0] > order[-1]:  # the same cycle run the other way
            continue
        tour = (first, *order, first)
        hops = [(min(a, b), max(a, b)) for a, b in itertools.pairwise(tour)]
        if all(h in pairs for h in hops):
            found.append(hops)
    return found


def _max_packing(
    cycles: list[list[tuple[int, int]]], capacity: dict[tuple[int, int], int]
) -> float:
    """max sum(y) over y >= 0 with, on every pair, the rates of the cycles through it at most
    its link count (scipy's HiGHS: deterministic for the same input)."""
    from scipy.optimize import linprog  # loaded only when a mesh group needs it

    pairs = sorted(capacity)
    row = {p: i for i, p in enumerate(pairs)}
    a_ub = [[0.0] * len(cycles) for _ in pairs]
    for j, hops in enumerate(cycles):
        for h in hops:
            a_ub[row[h]][j] += 1.0
    result = linprog(
        c=[-1.0] * len(cycles),
        A_ub=a_ub,
        b_ub=[float(capacity[p]) for p in pairs],
        bounds=(0, None),
        method="highs",
    )
    if result.status != 0 or result.fun is None:  # y = 0 is feasible, links bound y: never
        raise RuntimeError(f"mesh ring packing failed: {result.message}")
    return -float(result.fun)
