"""The execution graph of one training step: tasks on per-stage streams, schedule as edges.

Symmetry: every DP replica and every TP/CP rank of a stage runs the same tasks at the same
times, so the graph holds one replica's ``pp`` stages; DP collectives are priced over the
real DP group (`comm`). A 16k-GPU job is thus a graph of a few thousand nodes.

Schema (node id -> attributes; every node has ``kind``, ``stage``, ``stream``, ``duration_s``,
``label``):

* ``("F"|"B", stage, chunk, micro, piece)``: ``kind="compute"``, ``stream="compute"``; all
  layers of one model chunk for one micro-batch, forward or backward (recompute included).
  ``duration_s`` = kernels + blocking TP/EP collectives + CP excess; the parts are kept in
  ``compute_s``, ``tp_s``, ``ep_s``, ``cp_s``. A chunk's last backward is cut into ``buckets``
  equal pieces when DP gradient reduction overlaps backward; other tasks have ``piece = 0``.
* ``("P", "F"|"B", virtual_stage, micro)``: ``kind="comm"``, ``comm="pp"``, ``stream="pp"``;
  the activation (F) or gradient (B) send-recv leaving that virtual stage.
* ``("D", stage, chunk, bucket)``: ``comm="dp"``, ``stream="dp"``; gradient all-reduce or
  reduce-scatter of one bucket of a chunk.
* ``("G", stage, phase, chunk, micro)`` / ``("R", stage, chunk, micro)``: ZeRO-3 parameter
  all-gather before each task (``stream="dp-gather"``, prefetched) and gradient
  reduce-scatter after each backward (``stream="dp"``).
* ``("O", stage)``: ``kind="optimizer"``, ``stream="compute"``; the optimizer step.
* ``("A", stage)``: ``comm="dp"``; all-gather of updated parameters (sharded optimizer).

Edges (attribute ``dep``): ``"stream"`` (consecutive tasks of one stream of one stage, in
schedule order) and ``"data"`` (activations forward, gradients backward, gradients to their
reduction, reductions to the optimizer).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import networkx as nx

from simulator.schedules import SCHEDULES, Slot

Node = tuple[Any, ...]


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


def _pieces(costs: StepCosts, s: int, slot: Slot) -> int:
    last_b = slot.phase == "B" and slot.micro == costs.num_micro_batches - 1
    return costs.buckets if costs.overlap_grad_reduce and last_b else 1


def _add_task(g: nx.DiGraph, costs: StepCosts, s: int, slot: Slot, n: int) -> list[Node]:
    c = costs.chunks[s][slot.chunk]
    fw = slot.phase == "F"
    parts = {
        "compute_s": c.fw_compute_s if fw else c.bw_compute_s,
        "tp_s": c.fw_tp_s if fw else c.bw_tp_s,
        "ep_s": c.fw_ep_s if fw else c.bw_ep_s,
        "cp_s": c.fw_cp_s if fw else c.bw_cp_s,
    }
    total = sum(parts.values())
    ids = [(slot.phase, s, slot.chunk, slot.micro, k) for k in range(n)]
    for k, node in enumerate(ids):
        g.add_node(
            node,
            kind="compute",
            stage=s,
            stream="compute",
            duration_s=total / n,
            label=f"{slot.phase}{slot.micro} c{slot.chunk}" + (f" b{k}" if n > 1 else ""),
            **{key: val / n for key, val in parts.items()},
        )
    for a, b in itertools.pairwise(ids):
        g.add_edge(a, b, dep="stream")
    return ids


def _chain(g: nx.DiGraph, nodes: list[Node]) -> None:
    for a, b in itertools.pairwise(nodes):
        g.add_edge(a, b, dep="stream")


def _add_comm(g: nx.DiGraph, node: Node, stage: int, stream: str, duration_s: float) -> None:
    label = "-".join(str(x) for x in node)
    g.add_node(
        node,
        kind="comm",
        comm=stream.split("-")[0],
        stage=stage,
        stream=stream,
        duration_s=duration_s,
        label=label,
    )


def _add_pipeline_edges(
    g: nx.DiGraph, costs: StepCosts, ends: dict[Node, tuple[Node, Node]]
) -> None:
    pp, v, m = costs.pp, costs.v, costs.num_micro_batches
    nv = pp * v
    for vs in range(nv):
        s, c = vs % pp, vs // pp
        for i in range(m):
            _f_first, f_last = ends[("F", s, c, i)]
            b_first, b_last = ends[("B", s, c, i)]
            if vs + 1 < nv:
                hop = ("P", "F", vs, i)
                _add_comm(g, hop, s, "pp", costs.pp_hop_s)
                g.add_edge(f_last, hop, dep="data")
                g.add_edge(hop, ends[("F", (vs + 1) % pp, (vs + 1) // pp, i)][0], dep="data")
            else:
                g.add_edge(f_last, b_first, dep="data")
            if vs > 0:
                hop = ("P", "B", vs, i)
                _add_comm(g, hop, s, "pp", costs.pp_hop_s)
                g.add_edge(b_last, hop, dep="data")
                g.add_edge(hop, ends[("B", (vs - 1) % pp, (vs - 1) // pp, i)][0], dep="data")


def _add_zero3(
    g: nx.DiGraph, costs: StepCosts, s: int, order: list[Slot], ends: dict[Node, tuple[Node, Node]]
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
    order: list[Slot],
    ends: dict[Node, tuple[Node, Node]],
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
    orders = SCHEDULES[costs.schedule](costs.pp, costs.num_micro_batches, costs.v)
    ends: dict[Node, tuple[Node, Node]] = {}
    for s, order in enumerate(orders):
        prev: Node | None = None
        for slot in order:
            ids = _add_task(g, costs, s, slot, _pieces(costs, s, slot))
            ends[(slot.phase, s, slot.chunk, slot.micro)] = (ids[0], ids[-1])
            if prev is not None:
                g.add_edge(prev, ids[0], dep="stream")
            prev = ids[-1]
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
            label="optimizer",
        )
        for src in [last, *comm]:
            g.add_edge(src, opt, dep="data")
        if costs.param_gather_s[s] > 0:
            _add_comm(g, ("A", s), s, "dp", costs.param_gather_s[s])
            g.add_edge(opt, ("A", s), dep="data")
    return g


def _zero3(costs: StepCosts, s: int) -> bool:
    return any(c.zero3_gather_s > 0 for c in costs.chunks[s])
