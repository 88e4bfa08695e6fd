"""Walk an execution graph: start = latest end of its predecessors; then the critical path.

Stream order is already a set of edges (`execgraph`), so a static training step needs no
event queue: one pass in topological order gives every task's start and end.
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
    """Earliest start times under the graph's dependencies."""
    start: dict[Node, float] = {}
    end: dict[Node, float] = {}
    pred_of: dict[Node, Node | None] = {}
    durations = graph.nodes
    for node in nx.topological_sort(graph):
        best: Node | None = None
        t = 0.0
        for p in graph.predecessors(node):
            if best is None or end[p] > t:
                t, best = end[p], p
        start[node] = t
        end[node] = t + durations[node]["duration_s"]
        pred_of[node] = best
    return Timeline(graph, start, end, pred_of)


def critical_path(timeline: Timeline) -> list[Node]:
    """The chain of tasks that ends last, each started by the end of the one before."""
    if not timeline.end_s:
        return []
    node: Node | None = max(timeline.end_s, key=lambda n: timeline.end_s[n])
    path: list[Node] = []
    while node is not None:
        path.append(node)
        node = timeline.critical_pred[node]
    return path[::-1]
