"""Walk an execution graph: start = latest end of its predecessors; then the critical path.

Stream order is already a set of edges (`execgraph`), so a static training step needs no
event queue: one pass in topological order gives every task's start and end. An edge's delay
(a pipeline send) separates the end of one task from the start of the next.

The pass runs on a `Plan`: the frozen graph compiled once into a topological order and
predecessor index lists (cached per graph, so the layouts of one shape share it); a layout
only brings its prices. Each start is a max over the predecessors taken in the graph's
insertion order, so the result does not depend on the order ties are met in, and the same
inputs give the same times bit for bit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import networkx as nx

from simulator.execgraph import Node, StepGraph
from simulator.task_costs import CostKey


@dataclass(frozen=True, slots=True)
class Plan:
    """A graph compiled for scheduling."""

    nodes: tuple[Node, ...]  # topological order
    costs: tuple[CostKey, ...]  # per node
    preds: tuple[tuple[tuple[int, CostKey | None], ...], ...]  # (index, delay key) per node
    compute: tuple[tuple[int, ...], ...]  # per stage: indices of its compute tasks
    optimizer: tuple[int, ...]  # indices of the optimizer steps


@functools.lru_cache(maxsize=16)
def compile_plan(graph: nx.DiGraph) -> Plan:
    """Topological order (Kahn's algorithm) and predecessor lists of a frozen graph."""
    # The node and adjacency dicts themselves: the public views wrap every lookup in a new
    # object, which tripled the cost of this loop.
    attrs, preds, succs = graph._node, graph._pred, graph._succ
    waiting = {n: len(p) for n, p in preds.items()}
    ready = [n for n, k in waiting.items() if k == 0]
    order: list[Node] = []
    while ready:
        node = ready.pop()
        order.append(node)
        for s in succs[node]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    if len(order) != len(waiting):
        raise ValueError("execution graph has a cycle: the schedule's order deadlocks")
    index = {n: i for i, n in enumerate(order)}
    compute: dict[int, list[int]] = {}
    for i, n in enumerate(order):
        if attrs[n]["kind"] == "compute":
            compute.setdefault(attrs[n]["stage"], []).append(i)
    return Plan(
        nodes=tuple(order),
        costs=tuple(attrs[n]["cost"] for n in order),
        preds=tuple(tuple((index[p], e.get("delay")) for p, e in preds[n].items()) for n in order),
        compute=tuple(tuple(compute[s]) for s in sorted(compute)),
        optimizer=tuple(i for i, n in enumerate(order) if attrs[n]["kind"] == "optimizer"),
    )


@dataclass(frozen=True)
class Timeline:
    """Start, end and duration of every task (seconds from step start) and their graph.

    Times are lists in the plan's order (``start[i]`` is ``plan.nodes[i]``'s start); the
    per-node dicts are built on first use (traces and tests want them, sweeps do not)."""

    step: StepGraph
    plan: Plan
    start: list[float]
    end: list[float]
    duration: list[float]
    crit: list[int]  # index of the predecessor whose end started each task, -1 for none
    last: int  # index of the task that ends last (the first such in plan order)

    @property
    def graph(self) -> nx.DiGraph:
        """The (frozen) execution graph."""
        return self.step.graph

    @property
    def makespan_s(self) -> float:
        """End of the last task."""
        return self.end[self.last] if self.end else 0.0

    @functools.cached_property
    def start_s(self) -> dict[Node, float]:
        """Start of every task, by node."""
        return dict(zip(self.plan.nodes, self.start, strict=True))

    @functools.cached_property
    def end_s(self) -> dict[Node, float]:
        """End of every task, by node."""
        return dict(zip(self.plan.nodes, self.end, strict=True))


def schedule(step: StepGraph) -> Timeline:
    """Earliest start times under the graph's dependencies and the edges' delays."""
    plan = compile_plan(step.graph)
    price = step.seconds
    dur = [price[k] for k in plan.costs]
    n = len(dur)
    start = [0.0] * n
    end = [0.0] * n
    crit = [-1] * n
    last, last_end = -1, 0.0
    for i, preds in enumerate(plan.preds):
        best = -1
        t = 0.0
        for p, delay in preds:
            e = end[p] + (0.0 if delay is None else price[delay])
            if best < 0 or e > t:
                t, best = e, p
        start[i] = t
        end[i] = e = t + dur[i]
        crit[i] = best
        if last < 0 or e > last_end:
            last, last_end = i, e
    return Timeline(step, plan, start, end, dur, crit, last)


def critical_path(timeline: Timeline) -> list[Node]:
    """The chain of tasks that ends last, each started by the end (plus the edge's delay) of the
    one before."""
    nodes, crit = timeline.plan.nodes, timeline.crit
    path: list[Node] = []
    i = timeline.last
    while i >= 0:
        path.append(nodes[i])
        i = crit[i]
    return path[::-1]
