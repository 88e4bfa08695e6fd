"""The execution graph of one training step: tasks on per-stage streams, schedule as edges.

Symmetry: every DP replica and every TP/CP rank of a stage runs the same tasks at the same
times, so the graph holds one replica's ``pp`` stages; DP collectives are priced over the
real DP group (`comm`). A 16k-GPU job is thus a graph of a few thousand nodes.

Schema (node id -> attributes; every node has ``kind``, ``stage``, ``stream`` and
``duration_s``; `task_label` names a node from its id):

* ``("F"|"B", stage, chunk, micro, piece)``: ``kind="compute"``, ``stream="compute"``; all
  layers of one model chunk for one micro-batch, forward or backward (recompute included).
  ``duration_s`` = kernels + blocking TP/EP collectives + CP excess; the parts are kept in
  ``compute_s``, ``tp_s``, ``ep_s``, ``cp_s``. A chunk's last backward is cut into ``buckets``
  equal pieces when DP gradient reduction overlaps backward; other tasks have ``piece = 0``.
* ``("D", stage, chunk, bucket)``: ``comm="dp"``, ``stream="dp"``; gradient all-reduce or
  reduce-scatter of one bucket of a chunk.
* ``("G", stage, phase, chunk, micro)`` / ``("R", stage, chunk, micro)``: ZeRO-3 parameter
  all-gather before each task (``stream="dp-gather"``, prefetched) and gradient
  reduce-scatter after each backward (``stream="dp"``).
* ``("O", stage)``: ``kind="optimizer"``, ``stream="compute"``; the optimizer step.
* ``("A", stage)``: ``comm="dp"``; all-gather of updated parameters (sharded optimizer).

Edges (attribute ``dep``): ``"stream"`` (consecutive tasks of one stream of one stage, in
schedule order) and ``"data"`` (activations forward, gradients backward, gradients to their
reduction, reductions to the optimizer). A data edge between pipeline stages carries the
point-to-point send-recv as ``delay_s`` (``comm="pp"``): the activation (forward) or gradient
(backward) leaving virtual stage ``vs`` for micro-batch ``i``; the receiver starts ``delay_s``
after the sender ends. Sends are latency, not a contended stream, so they need no node of
their own, which halves the graph of a deep pipeline.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

from simulator.schedules import Slot, stage_orders

Node = tuple[Any, ...]
Ends = tuple[Node, Node]  # first and last piece of one task


@dataclass(frozen=True, slots=True)
class ChunkCost:
    """Per-micro-batch costs of one model chunk on one stage, seconds."""

    fw_compute_s: float
    bw_compute_s: float
    fw_tp_s: float = 0.0
    bw_tp_s: float = 0.0
    fw_ep_s: float = 0.0
    bw_ep_s: float = 0.0
    fw_cp_s: float = 0.0
    bw_cp_s: float = 0.0
    grad_sync_s: float = 0.0  # whole chunk, once per step (ZeRO-0/1/2)
    zero3_gather_s: float = 0.0  # per task
    zero3_scatter_s: float = 0.0  # per backward


@dataclass(frozen=True, slots=True)
class StepCosts:
    """Everything `build_exec_graph` needs, as plain numbers."""

    chunks: tuple[tuple[ChunkCost, ...], ...]  # [stage][chunk]
    num_micro_batches: int
    schedule: str
    pp_hop_s: float
    optimizer_s: tuple[float, ...]  # per stage
    param_gather_s: tuple[float, ...]  # per stage, after the optimizer
    overlap_grad_reduce: bool = True
    buckets: int = 1

    @property
    def pp(self) -> int:
        """Pipeline stages."""
        return len(self.chunks)

    @property
    def v(self) -> int:
        """Model chunks per stage."""
        return len(self.chunks[0])


def _pieces(costs: StepCosts, slot: Slot) -> int:
    last_b = slot.phase == "B" and slot.micro == costs.num_micro_batches - 1
    return costs.buckets if costs.overlap_grad_reduce and last_b else 1


def _task_attrs(costs: StepCosts, s: int, slot: Slot, n: int) -> dict[str, Any]:
    """Attributes of each of the ``n`` pieces of one compute task (equal for all micro-batches)."""
    c = costs.chunks[s][slot.chunk]
    fw = slot.phase == "F"
    parts = {
        "compute_s": c.fw_compute_s if fw else c.bw_compute_s,
        "tp_s": c.fw_tp_s if fw else c.bw_tp_s,
        "ep_s": c.fw_ep_s if fw else c.bw_ep_s,
        "cp_s": c.fw_cp_s if fw else c.bw_cp_s,
    }
    total = sum(parts.values())
    return {
        "kind": "compute",
        "stage": s,
        "stream": "compute",
        "duration_s": total / n,
        **{key: val / n for key, val in parts.items()},
    }


def _add_stage_tasks(
    g: nx.DiGraph, costs: StepCosts, s: int, order: Sequence[Slot], ends: dict[Node, Ends]
) -> None:
    """All compute tasks of one stage, chained on its compute stream in schedule order."""
    attrs: dict[tuple[int, str, int], dict[str, Any]] = {}
    nodes: list[tuple[Node, dict[str, Any]]] = []
    for slot in order:
        n = _pieces(costs, slot)
        key = (slot.chunk, slot.phase, n)
        if key not in attrs:
            attrs[key] = _task_attrs(costs, s, slot, n)
        first = (slot.phase, s, slot.chunk, slot.micro, 0)
        last = (slot.phase, s, slot.chunk, slot.micro, n - 1)
        nodes += [((slot.phase, s, slot.chunk, slot.micro, k), attrs[key]) for k in range(n)]
        ends[(slot.phase, s, slot.chunk, slot.micro)] = (first, last)
    g.add_nodes_from(nodes)
    _chain(g, [node for node, _ in nodes])


def _chain(g: nx.DiGraph, nodes: list[Node]) -> None:
    g.add_edges_from(itertools.pairwise(nodes), dep="stream")


def _add_comm(g: nx.DiGraph, node: Node, stage: int, stream: str, duration_s: float) -> None:
    g.add_node(
        node,
        kind="comm",
        comm=stream.split("-")[0],
        stage=stage,
        stream=stream,
        duration_s=duration_s,
    )


def _add_pipeline_edges(g: nx.DiGraph, costs: StepCosts, ends: dict[Node, Ends]) -> None:
    pp, v, m = costs.pp, costs.v, costs.num_micro_batches
    nv = pp * v
    hop = {"dep": "data", "comm": "pp", "delay_s": costs.pp_hop_s}
    edges: list[tuple[Node, Node, dict[str, Any]]] = []
    for vs in range(nv):
        s, c = vs % pp, vs // pp
        nxt = ((vs + 1) % pp, (vs + 1) // pp)
        prv = ((vs - 1) % pp, (vs - 1) // pp)
        for i in range(m):
            f_last = ends[("F", s, c, i)][1]
            b_first, b_last = ends[("B", s, c, i)]
            if vs + 1 < nv:
                edges.append((f_last, ends[("F", *nxt, i)][0], hop))
            else:
                edges.append((f_last, b_first, {"dep": "data"}))
            if vs > 0:
                edges.append((b_last, ends[("B", *prv, i)][0], hop))
    g.add_edges_from(edges)


def _add_zero3(
    g: nx.DiGraph, costs: StepCosts, s: int, order: Sequence[Slot], ends: dict[Node, Ends]
) -> list[Node]:
    gathers, scatters = [], []
    for slot in order:
        c = costs.chunks[s][slot.chunk]
        first, last = ends[(slot.phase, s, slot.chunk, slot.micro)]
        node = ("G", s, slot.phase, slot.chunk, slot.micro)
        _add_comm(g, node, s, "dp-gather", c.zero3_gather_s)
        g.add_edge(node, first, dep="data")
        gathers.append(node)
        if slot.phase == "B":
            red = ("R", s, slot.chunk, slot.micro)
            _add_comm(g, red, s, "dp", c.zero3_scatter_s)
            g.add_edge(last, red, dep="data")
            scatters.append(red)
    _chain(g, gathers)
    return scatters


def _add_grad_sync(
    g: nx.DiGraph,
    costs: StepCosts,
    s: int,
    order: Sequence[Slot],
    ends: dict[Node, Ends],
    last: Node,
) -> list[Node]:
    nodes: list[Node] = []
    for slot in order:
        if slot.phase != "B" or slot.micro != costs.num_micro_batches - 1:
            continue  # every schedule runs micro-batch m-1 last on each chunk
        c = costs.chunks[s][slot.chunk]
        n = costs.buckets if costs.overlap_grad_reduce else 1
        for k in range(n):
            node = ("D", s, slot.chunk, k)
            _add_comm(g, node, s, "dp", c.grad_sync_s / n)
            src = ("B", s, slot.chunk, slot.micro, k) if costs.overlap_grad_reduce else last
            g.add_edge(src, node, dep="data")
            nodes.append(node)
    return nodes


def build_exec_graph(costs: StepCosts) -> nx.DiGraph:
    """One step's task graph (schema in the module docstring)."""
    g = nx.DiGraph()
    orders = stage_orders(costs.schedule, costs.pp, costs.num_micro_batches, costs.v)
    ends: dict[Node, Ends] = {}
    for s, order in enumerate(orders):
        _add_stage_tasks(g, costs, s, order, ends)
    _add_pipeline_edges(g, costs, ends)
    for s, order in enumerate(orders):
        last = ends[(order[-1].phase, s, order[-1].chunk, order[-1].micro)][1]
        comm = _add_zero3(g, costs, s, order, ends) if _zero3(costs, s) else []
        comm += _add_grad_sync(g, costs, s, order, ends, last)
        _chain(g, comm)
        opt = ("O", s)
        g.add_node(
            opt,
            kind="optimizer",
            stage=s,
            stream="compute",
            duration_s=costs.optimizer_s[s],
        )
        for src in [last, *comm]:
            g.add_edge(src, opt, dep="data")
        if costs.param_gather_s[s] > 0:
            _add_comm(g, ("A", s), s, "dp", costs.param_gather_s[s])
            g.add_edge(opt, ("A", s), dep="data")
    return g


def task_label(node: Node) -> str:
    """A short name for a node from its id: ``F3 c0``, ``B7 c1 b2``, ``D-0-1-2``, ``optimizer``."""
    kind = node[0]
    if kind in ("F", "B"):
        _, _, chunk, micro, piece = node
        return f"{kind}{micro} c{chunk}" + (f" b{piece}" if piece else "")
    if kind == "O":
        return "optimizer"
    return "-".join(str(x) for x in node)


def _zero3(costs: StepCosts, s: int) -> bool:
    return any(c.zero3_gather_s > 0 for c in costs.chunks[s])
