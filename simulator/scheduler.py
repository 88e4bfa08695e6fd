"""Walk an execution graph: start = latest end of its predecessors; then the critical path.

Stream order is already a set of edges (`execgraph`), so a static training step needs no
event queue: one pass in topological order gives every task's start and end. An edge's
``delay_s`` (a pipeline send) separates the end of one task from the start of the next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import networkx as nx

Node = tuple[Any, ...]


@dataclass(frozen=True)
class Timeline:
    """Start and end of every task (seconds from step start) and the graph they came from."""

    graph: nx.DiGraph
    start_s: dict[Node, float]
    end_s: dict[Node, float]
    critical_pred: dict[Node, Node | None]

    @property
    def makespan_s(self) -> float:
        """End of the last task."""
        return max(self.end_s.values(), default=0.0)


def schedule(graph: nx.DiGraph) -> Timeline:
    """Earliest start times under the graph's dependencies and the edges' ``delay_s``.

    Kahn's algorithm on the adjacency dicts: each node is timed once all its predecessors are;
    the times do not depend on the order ties are taken in (a start is a max over predecessors,
    taken in their insertion order), so the result is the same bit for bit on every run.
    """
    start: dict[Node, float] = {}
    end: dict[Node, float] = {}
    pred_of: dict[Node, Node | None] = {}
    # The node and adjacency dicts themselves: the public views wrap every lookup in a new
    # object, which tripled the cost of this loop.
    attrs, preds, succs = graph._node, graph._pred, graph._succ
    waiting = {n: len(p) for n, p in preds.items()}
    ready = [n for n, k in waiting.items() if k == 0]
    while ready:
        node = ready.pop()
        best: Node | None = None
        t = 0.0
        for p, edge in preds[node].items():
            e = end[p] + edge.get("delay_s", 0.0)
            if best is None or e > t:
                t, best = e, p
        start[node] = t
        end[node] = t + attrs[node]["duration_s"]
        pred_of[node] = best
        for s in succs[node]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    if len(end) != len(waiting):
        raise ValueError("execution graph has a cycle: the schedule's order deadlocks")
    return Timeline(graph, start, end, pred_of)


def critical_path(timeline: Timeline) -> list[Node]:
    """The chain of tasks that ends last, each started by the end (plus the edge's delay) of the
    one before."""
    if not timeline.end_s:
        return []
    node: Node | None = max(timeline.end_s, key=lambda n: timeline.end_s[n])
    path: list[Node] = []
    while node is not None:
        path.append(node)
        node = timeline.critical_pred[node]
    return path[::-1]
