"""The communication tasks of the execution graph (`execgraph`, whose docstring holds the
schema): DP gradient reductions per bucket (``D``), ZeRO-3 gathers (``G``) and ZeRO-2/-3
scatters (``R``) on one ``dp`` stream, sequence parallelism's norm-gradient all-reduce
(``N``), the tied embedding's all-reduce (``E``), and the parameter all-gather (``A``) added
with `add_comm_task`. Each adds its nodes and data edges to a graph being built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import networkx as nx

from simulator.schedules import Slot
from simulator.task_costs import EMBEDDING_SYNC, CostKey

if TYPE_CHECKING:  # execgraph imports this module
    from simulator.execgraph import Ends, Node, Shape


def add_comm_task(g: nx.DiGraph, node: Node, stage: int, stream: str, cost: CostKey) -> None:
    """A communication node on ``stream`` of stage ``stage``; its ``comm`` kind is the
    stream's name up to a hyphen."""
    comm = stream.split("-")[0]
    g.add_node(node, kind="comm", comm=comm, stage=stage, stream=stream, cost=cost)


def add_zero3_tasks(
    g: nx.DiGraph, s: int, order: Sequence[Slot], ends: dict[Node, Ends], *, gathers: bool
) -> list[Node]:
    """ZeRO-3's gathers (``gathers``) and ZeRO-2's or -3's scatters of one stage, in the order
    its ``dp`` stream runs them: the next task's gather before this backward's scatter (FSDP's
    backward prefetch). One stream: they share the stage's links (on two streams each ran at
    the links' full speed)."""
    stream: list[Node] = []
    for k, slot in enumerate(order):
        if gathers and k == 0:
            stream.append(_zero3_gather(g, s, slot, ends))
        if gathers and k + 1 < len(order):
            stream.append(_zero3_gather(g, s, order[k + 1], ends))
        if slot.phase == "B":
            red = ("R", s, slot.chunk, slot.micro)
            add_comm_task(g, red, s, "dp", ("zero3_scatter", s, slot.chunk))
            g.add_edge(ends[("B", s, slot.chunk, slot.micro)][1], red, dep="data")
            stream.append(red)
    return stream


def _zero3_gather(g: nx.DiGraph, s: int, slot: Slot, ends: dict[Node, Ends]) -> Node:
    node = ("G", s, slot.phase, slot.chunk, slot.micro)
    add_comm_task(g, node, s, "dp", ("zero3_gather", s, slot.chunk))
    g.add_edge(node, ends[(slot.phase, s, slot.chunk, slot.micro)][0], dep="data")
    return node


def add_grad_sync(
    g: nx.DiGraph, shape: Shape, s: int, order: Sequence[Slot], last: Node
) -> list[Node]:
    """Stage ``s``'s DP gradient reduction: per chunk, ``shape.pieces`` buckets after its last
    backward's pieces when reduction overlaps backward, else all after the stage's ``last``
    task."""
    nodes: list[Node] = []
    n = shape.pieces
    for slot in order:
        if slot.phase != "B" or slot.micro != shape.m - 1:
            continue  # every schedule runs micro-batch m-1 last on each chunk
        for k in range(n):
            node = ("D", s, slot.chunk, k)
            add_comm_task(g, node, s, "dp", ("grad_sync", s, slot.chunk, n))
            src = ("B", s, slot.chunk, slot.micro, k) if shape.overlap_grad_reduce else last
            g.add_edge(src, node, dep="data")
            nodes.append(node)
    return nodes


def add_norm_sync(g: nx.DiGraph, s: int, ready: list[Node]) -> list[Node]:
    """Stage ``s``'s norm-gradient all-reduce over TP: it waits for what the optimizer step
    waited for (``ready``), and the step now waits for it."""
    node: Node = ("N", s)
    add_comm_task(g, node, s, "tp", ("norm_sync", s))
    g.add_edges_from(((src, node) for src in ready), dep="data")
    return [node]


def add_embedding_sync(g: nx.DiGraph, ready: list[list[Node]], pp: int) -> None:
    """The tied embedding's all-reduce: it waits for the first and the last stage's last
    backward and gradient reductions (Megatron's ``finish_grad_sync`` comes first), and both
    stages' optimizer steps wait for it (``ready`` gains it on those two stages)."""
    node: Node = ("E",)
    add_comm_task(g, node, 0, "pp", EMBEDDING_SYNC)
    for s in (0, pp - 1):
        g.add_edges_from(((src, node) for src in ready[s]), dep="data")
        ready[s] = [*ready[s], node]
