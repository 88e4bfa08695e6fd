"""The execution graph of one training step: tasks on per-stage streams, schedule as edges.

Symmetry: every DP replica and every TP/CP rank of a stage runs the same tasks at the same
times, so the graph holds one replica's ``pp`` stages; DP collectives are priced over the
real DP group (`dp_comm`). A 16k-GPU job is thus a graph of a few thousand nodes.

Structure and prices are kept apart. The graph depends only on the step's `Shape` (schedule,
stages, chunks, micro-batches, buckets, which stages gather ZeRO-3 parameters); it is built
once per shape, frozen and shared by every layout of that shape (a sweep has many). Each node
and each timed edge names a *cost key* (`simulator.task_costs`); `StepGraph` pairs the graph
with one layout's price of every key (`seconds`).

Schema (node id -> attributes; every node has ``kind``, ``stage``, ``stream`` and ``cost``;
`StepGraph.duration_s` prices a node, `task_label` names it):

* ``("F"|"B", stage, chunk, micro, piece)``: ``kind="compute"``, ``stream="compute"``; all
  layers of one model chunk for one micro-batch, forward or backward (recompute included).
  Its time = kernels + blocking TP/EP collectives + CP excess + blocking ZeRO-3 collectives
  (``zero3_impl = "deepspeed-2021"``) (`StepGraph.parts` splits it into ``compute_s``,
  ``tp_s``, ``ep_s``, ``cp_s``, ``dp_s``). A chunk's last backward is cut into
  ``buckets`` equal pieces when DP gradient reduction overlaps backward; other tasks have
  ``piece = 0``.
* ``("D", stage, chunk, bucket)``: ``comm="dp"``, ``stream="dp"``; gradient all-reduce or
  reduce-scatter of one bucket of a chunk.
* ``("G", stage, phase, chunk, micro)`` / ``("R", stage, chunk, micro)``: ZeRO-3 parameter
  all-gather before each task and gradient reduce-scatter after each backward, on one
  ``stream="dp"`` (they share the links): the next task's gather runs before this backward's
  scatter (prefetched one task ahead, FSDP's backward prefetch). ZeRO-2 with more than one
  micro-batch has the reduce-scatters alone: a rank keeps only its share of the gradients, so
  each backward's are reduced before the next accumulates (DeepSpeed, FSDP SHARD_GRAD_OP).
* ``("O", stage)``: ``kind="optimizer"``, ``stream="compute"``; the optimizer step.
* ``("A", stage)``: ``comm="dp"``; all-gather of updated parameters (sharded optimizer).
* ``("N", stage)``: ``comm="tp"``, ``stream="tp"``; sequence parallelism's all-reduce of the
  stage's norm (and row-parallel bias) gradients over its TP group (`simulator.finalize_grads`):
  after the stage's last backward and gradient reductions, before its optimizer step (and
  before the tied embedding's all-reduce, as Megatron's ``finalize_model_grads`` runs them).
* ``("E",)``: ``comm="pp"``, ``stream="pp"``, ``stage=0``; the tied word embedding's gradient
  all-reduce between the first and the last stage (`simulator.finalize_grads`): after both
  stages' last backward and gradient reductions, before both stages' optimizer steps.

Edges (attribute ``dep``): ``"stream"`` (consecutive tasks of one stream of one stage, in
schedule order) and ``"data"`` (activations forward, gradients backward, gradients to their
reduction, reductions to the optimizer). A data edge between pipeline stages carries the
point-to-point send-recv (``comm="pp"``, cost key in ``delay``): the activation (forward) or
gradient (backward) leaving virtual stage ``vs`` for micro-batch ``i``; the receiver starts
that long after the sender ends. Sends are latency, not a contended stream, so they need no
node of their own, which halves the graph of a deep pipeline. With ``blocking_sends`` the
stream edge after a sending task carries the same delay (the stage waits for its send).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

from simulator.comm_tasks import (
    add_comm_task,
    add_embedding_sync,
    add_grad_sync,
    add_norm_sync,
    add_zero3_tasks,
)
from simulator.schedules import Slot, stage_orders
from simulator.task_costs import PP_HOP, CostKey, StepCosts

Node = tuple[Any, ...]
Ends = tuple[Node, Node]  # first and last piece of one task
_PARTS = ("compute_s", "tp_s", "ep_s", "cp_s", "dp_s")


@dataclass(frozen=True, slots=True)
class Shape:
    """What the graph's structure depends on (not on any duration)."""

    schedule: str
    pp: int
    v: int
    m: int
    pieces: int  # of a chunk's last backward: buckets when reduction overlaps backward
    overlap_grad_reduce: bool
    zero3: tuple[bool, ...]  # per stage: ZeRO-3 gathers present
    param_gather: tuple[bool, ...]  # per stage: parameter all-gather after the optimizer
    # per stage: a gradient reduce-scatter after every backward (ZeRO-3; ZeRO-2 accumulating)
    scatters: tuple[bool, ...]
    blocking_sends: bool  # a send holds its stage's compute stream
    embedding_sync: bool  # the tied embedding's all-reduce, first and last stage
    norm_sync: tuple[bool, ...]  # per stage: the SP norms' TP all-reduce

    @classmethod
    def of(cls, costs: StepCosts) -> Shape:
        """The shape of one layout's costs."""
        overlap = costs.overlap_grad_reduce
        return cls(
            schedule=costs.schedule,
            pp=costs.pp,
            v=costs.v,
            m=costs.num_micro_batches,
            pieces=costs.buckets if overlap else 1,
            overlap_grad_reduce=overlap,
            zero3=tuple(any(c.zero3_gather_s > 0 for c in row) for row in costs.chunks),
            param_gather=tuple(t > 0 for t in costs.param_gather_s),
            scatters=tuple(any(c.zero3_scatter_s > 0 for c in row) for row in costs.chunks),
            blocking_sends=costs.blocking_sends,
            embedding_sync=costs.embedding_sync_s > 0 and costs.pp > 1,
            # StepCosts built without it (tests) leave it empty: no stage has one
            norm_sync=tuple(t > 0 for t in costs.norm_sync_s) or (False,) * costs.pp,
        )


@dataclass(frozen=True)
class StepGraph:
    """A frozen execution graph (shared by a shape) with one layout's prices."""

    graph: nx.DiGraph
    costs: StepCosts
    seconds: dict[CostKey, float]

    def duration_s(self, node: Node) -> float:
        """Seconds the node's task takes."""
        return self.seconds[self.graph.nodes[node]["cost"]]

    def delay_s(self, u: Node, v: Node) -> float:
        """Seconds between the end of ``u`` and the earliest start of ``v`` (a send)."""
        key = self.graph.edges[u, v].get("delay")
        return 0.0 if key is None else self.seconds[key]

    def parts(self, node: Node) -> dict[str, float]:
        """A compute node's time: ``compute_s``, ``tp_s``, ``ep_s``, ``cp_s``, ``dp_s``."""
        _, s, chunk, phase, n = self.graph.nodes[node]["cost"]
        parts = self.costs.chunks[s][chunk].parts(phase)
        return {k: t / n for k, t in zip(_PARTS, parts, strict=True)}


def build_exec_graph(costs: StepCosts) -> StepGraph:
    """One step's task graph (schema in the module docstring) with its prices."""
    graph = exec_graph(Shape.of(costs))
    keys: tuple[CostKey, ...] = graph.graph["cost_keys"]
    return StepGraph(graph, costs, {k: costs.seconds(k) for k in keys})


@functools.lru_cache(maxsize=16)
def exec_graph(shape: Shape) -> nx.DiGraph:
    """The frozen graph of one shape; ``graph.graph["cost_keys"]`` lists the keys it prices."""
    g = nx.DiGraph()
    orders = stage_orders(shape.schedule, shape.pp, shape.m, shape.v)
    ends: dict[Node, Ends] = {}
    for s, order in enumerate(orders):
        _add_stage_tasks(g, shape, s, order, ends)
    _add_pipeline_edges(g, shape, ends)
    ready: list[list[Node]] = []  # per stage: what its optimizer step waits for
    for s, order in enumerate(orders):
        last = ends[(order[-1].phase, s, order[-1].chunk, order[-1].micro)][1]
        per_task = shape.zero3[s] or shape.scatters[s]
        comm = add_zero3_tasks(g, s, order, ends, gathers=shape.zero3[s]) if per_task else []
        comm += add_grad_sync(g, shape, s, order, last)
        _chain(g, comm)
        ready.append([last, *comm])
        if shape.norm_sync[s]:
            ready[s] = add_norm_sync(g, s, ready[s])
    if shape.embedding_sync:
        add_embedding_sync(g, ready, shape.pp)
    for s, srcs in enumerate(ready):
        opt = ("O", s)
        g.add_node(opt, kind="optimizer", stage=s, stream="compute", cost=("optimizer", s))
        g.add_edges_from(((src, opt) for src in srcs), dep="data")
        if shape.param_gather[s]:
            add_comm_task(g, ("A", s), s, "dp", ("param_gather", s))
            g.add_edge(opt, ("A", s), dep="data")
    keys = {a["cost"]: None for a in g.nodes.values()}
    if any("delay" in e for e in g.edges.values()):
        keys[PP_HOP] = None
    g.graph["cost_keys"] = tuple(keys)
    return nx.freeze(g)


def _add_stage_tasks(
    g: nx.DiGraph, shape: Shape, s: int, order: Sequence[Slot], ends: dict[Node, Ends]
) -> None:
    """All compute tasks of one stage, chained on its compute stream in schedule order."""
    attrs: dict[tuple[int, str, int], dict[str, Any]] = {}
    nodes: list[tuple[Node, dict[str, Any]]] = []
    for slot in order:
        n = shape.pieces if slot.phase == "B" and slot.micro == shape.m - 1 else 1
        key = (slot.chunk, slot.phase, n)
        if key not in attrs:
            cost = ("task", s, slot.chunk, slot.phase, n)
            attrs[key] = {"kind": "compute", "stage": s, "stream": "compute", "cost": cost}
        nodes += [((slot.phase, s, slot.chunk, slot.micro, k), attrs[key]) for k in range(n)]
        ends[(slot.phase, s, slot.chunk, slot.micro)] = (nodes[-n][0], nodes[-1][0])
    g.add_nodes_from(nodes)
    _chain(g, [node for node, _ in nodes])
    if shape.blocking_sends:
        _block_on_sends(g, shape, s, order, ends)


def _block_on_sends(
    g: nx.DiGraph, shape: Shape, s: int, order: Sequence[Slot], ends: dict[Node, Ends]
) -> None:
    """A task that sends (a forward below the last virtual stage, a backward above the first)
    holds the compute stream for the send: its stream edge to the next task gets the delay."""
    last_vs = shape.pp * shape.v - 1
    for slot, nxt in itertools.pairwise(order):
        vs = slot.chunk * shape.pp + s
        if (vs < last_vs) if slot.phase == "F" else (vs > 0):
            src = ends[(slot.phase, s, slot.chunk, slot.micro)][1]
            dst = ends[(nxt.phase, s, nxt.chunk, nxt.micro)][0]
            g.add_edge(src, dst, dep="stream", comm="pp", delay=PP_HOP)


def _chain(g: nx.DiGraph, nodes: list[Node]) -> None:
    g.add_edges_from(itertools.pairwise(nodes), dep="stream")


def _add_pipeline_edges(g: nx.DiGraph, shape: Shape, ends: dict[Node, Ends]) -> None:
    pp, v, m = shape.pp, shape.v, shape.m
    nv = pp * v
    hop = {"dep": "data", "comm": "pp", "delay": PP_HOP}
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


def task_label(node: Node) -> str:
    """A short name for a node from its id: ``F3 c0``, ``B7 c1 b2``, ``D-0-1-2``, ``optimizer``."""
    kind = node[0]
    if kind in ("F", "B"):
        _, _, chunk, micro, piece = node
        return f"{kind}{micro} c{chunk}" + (f" b{piece}" if piece else "")
    if kind == "O":
        return "optimizer"
    return "-".join(str(x) for x in node)
