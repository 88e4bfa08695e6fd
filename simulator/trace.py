"""Timeline -> Chrome trace JSON (chrome://tracing, ui.perfetto.dev).

One process per pipeline stage (one representative GPU), one thread per stream that has
work (compute, pp, dp, tp); complete events (``ph = "X"``) with ``ts`` and ``dur`` in
microseconds, as the format defines them. Event names say what a task is (``forward mb3``,
``dp gradient sync bucket 0``, `event_name`); ``args`` holds the task's id in the execution
graph (``task``, as `task_label` writes it), its micro-batch and chunk, and the blocking
communication inside a compute task in seconds (``tp_s``, ``cp_s``, ``ep_s``, ``dp_s``).
Pipeline sends are edges of the graph (``delay_s``), drawn on the sender's pp thread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator.execgraph import Node, task_label
from simulator.scheduler import Timeline

STREAM_TIDS = {"compute": 0, "pp": 1, "dp": 2, "tp": 3}
_PHASE = {"F": "forward", "B": "backward"}


def event_name(node: Node, *, chunks: int = 1, cut: bool = False) -> str:
    """What a task is, in words: ``forward mb3``, ``backward mb7 chunk 1 part 2`` (``cut``: a
    backward cut into pieces, one per gradient bucket), ``dp gradient sync bucket 0``,
    ``zero3 all-gather for forward mb1``, ``optimizer``; the chunk only where a stage holds
    several (``chunks``)."""
    kind = node[0]
    if kind in _PHASE:
        _, _, c, micro, piece = node
        part = f" part {piece + 1}" if cut else ""
        return f"{_PHASE[kind]} mb{micro}{_chunk(c, chunks)}{part}"
    if kind == "D":
        return f"dp gradient sync{_chunk(node[2], chunks)} bucket {node[3]}"
    if kind == "G":
        return f"zero3 all-gather for {_PHASE[node[2]]} mb{node[4]}{_chunk(node[3], chunks)}"
    if kind == "R":
        return f"zero reduce-scatter mb{node[3]}{_chunk(node[2], chunks)}"  # ZeRO-2 or 3
    if kind == "A":
        return "dp parameter all-gather"
    if kind == "O":
        return "optimizer"
    if kind == "N":
        return "norm gradient all-reduce over tp (sequence parallelism)"
    if kind == "E":
        return "tied embedding gradient all-reduce (first and last stage)"
    return task_label(node)


def _chunk(chunk: int, chunks: int) -> str:
    return f" chunk {chunk}" if chunks > 1 else ""


def _cut(graph: Any, node: Node) -> bool:
    """A backward cut into pieces (its chunk's last one, when DP reduction overlaps it)."""
    return node[0] == "B" and (node[4] > 0 or (*node[:4], 1) in graph)


def _task_args(node: Node) -> dict[str, Any]:
    """The task id and, for a forward or backward, its micro-batch and chunk."""
    args: dict[str, Any] = {"task": task_label(node)}
    if node[0] in _PHASE:
        args |= {"micro_batch": node[3], "chunk": node[2]}
    return args


def chrome_trace(timeline: Timeline) -> dict[str, Any]:
    """The trace as a JSON-ready dict."""
    events = [*_task_events(timeline), *_send_events(timeline)]
    stages = {a["stage"] for a in timeline.graph.nodes.values()}
    threads = {(e["pid"], e["tid"]) for e in events}
    return {"traceEvents": events + _name_events(stages, threads), "displayTimeUnit": "ms"}


def _task_events(timeline: Timeline) -> list[dict[str, Any]]:
    """One complete event per task that takes time, on its stage's stream thread."""
    step = timeline.step
    events: list[dict[str, Any]] = []
    for node, a in timeline.graph.nodes.items():
        duration = step.duration_s(node)
        if duration <= 0:
            continue
        parts = step.parts(node) if a["kind"] == "compute" else {}
        args = _task_args(node) | {
            k: parts[k] for k in ("tp_s", "cp_s", "ep_s", "dp_s") if k in parts and parts[k] > 0
        }
        events.append(
            {
                "name": event_name(node, chunks=step.costs.v, cut=_cut(timeline.graph, node)),
                "cat": a.get("comm", a["kind"]),
                "ph": "X",
                "pid": a["stage"],
                "tid": STREAM_TIDS.get(a["stream"], 9),
                "ts": timeline.start_s[node] * 1e6,
                "dur": duration * 1e6,
                "args": args,
            }
        )
    return events


def _send_events(timeline: Timeline) -> list[dict[str, Any]]:
    """One complete event per pipeline send (a data edge with a delay), on the sender's
    thread of its stream, from the sending task's end."""
    step = timeline.step
    events: list[dict[str, Any]] = []
    for (src, dst), e in timeline.graph.edges.items():
        delay = step.delay_s(src, dst) if "comm" in e and e["dep"] == "data" else 0.0
        if delay <= 0:
            continue
        sent = event_name(src, chunks=step.costs.v, cut=_cut(timeline.graph, src))
        events.append(
            {
                "name": f"pp send {sent}",
                "cat": e["comm"],
                "ph": "X",
                "pid": _stage(timeline, src),
                "tid": STREAM_TIDS[e["comm"]],
                "ts": timeline.end_s[src] * 1e6,
                "dur": delay * 1e6,
                "args": {"task": f"send {task_label(src)}", "to_stage": _stage(timeline, dst)},
            }
        )
    return events


def _name_events(stages: set[int], threads: set[tuple[int, int]]) -> list[dict[str, Any]]:
    """Metadata events naming each stage's process and each of its threads that has work."""
    names = {tid: stream for stream, tid in STREAM_TIDS.items()}
    events: list[dict[str, Any]] = []
    for s in sorted(stages):
        events.append(
            {"name": "process_name", "ph": "M", "pid": s, "args": {"name": f"pp stage {s}"}}
        )
        for tid in sorted(t for st, t in threads if st == s):
            meta = {"name": "thread_name", "ph": "M", "pid": s, "tid": tid}
            events.append({**meta, "args": {"name": names.get(tid, "other")}})
    return events


def _stage(timeline: Timeline, node: Node) -> int:
    stage: int = timeline.graph.nodes[node]["stage"]
    return stage


def write_trace(timeline: Timeline, path: Path) -> None:
    """Write the Chrome trace of a timeline to ``path``."""
    path.write_text(json.dumps(chrome_trace(timeline)))
