"""Timeline -> Chrome trace JSON (chrome://tracing, ui.perfetto.dev).

One process per pipeline stage (one representative GPU), one thread per stream (compute, pp,
dp, dp-gather); complete events (``ph = "X"``) in microseconds. Pipeline sends are edges of the
graph (``delay_s``), drawn on the sender's pp thread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator.execgraph import task_label
from simulator.scheduler import Timeline

STREAM_TIDS = {"compute": 0, "pp": 1, "dp": 2, "dp-gather": 3}


def chrome_trace(timeline: Timeline) -> dict[str, Any]:
    """The trace as a JSON-ready dict."""
    events: list[dict[str, Any]] = []
    stages = set()
    step = timeline.step
    for node, a in timeline.graph.nodes.items():
        stages.add(a["stage"])
        duration = timeline.step.duration_s(node)
        if duration <= 0:
            continue
        parts = step.parts(node) if a["kind"] == "compute" else {}
        args = {
            k: parts[k] for k in ("tp_s", "cp_s", "ep_s", "dp_s") if k in parts and parts[k] > 0
        }
        events.append(
            {
                "name": task_label(node),
                "cat": a.get("comm", a["kind"]),
                "ph": "X",
                "pid": a["stage"],
                "tid": STREAM_TIDS.get(a["stream"], 9),
                "ts": timeline.start_s[node] * 1e6,
                "dur": duration * 1e6,
                "args": args,
            }
        )
    for (src, dst), e in timeline.graph.edges.items():
        delay = step.delay_s(src, dst) if "comm" in e and e["dep"] == "data" else 0.0
        if delay > 0:
            events.append(
                {
                    "name": f"send {task_label(src)}",
                    "cat": e["comm"],
                    "ph": "X",
                    "pid": timeline.graph.nodes[src]["stage"],
                    "tid": STREAM_TIDS[e["comm"]],
                    "ts": timeline.end_s[src] * 1e6,
                    "dur": delay * 1e6,
                    "args": {},
                }
            )
    for s in sorted(stages):
        events.append({"name": "process_name", "ph": "M", "pid": s, "args": {"name": f"stage {s}"}})
        for stream, tid in STREAM_TIDS.items():
            meta = {"name": "thread_name", "ph": "M", "pid": s, "tid": tid}
            events.append({**meta, "args": {"name": stream}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(timeline: Timeline, path: Path) -> None:
    """Write the Chrome trace of a timeline to ``path``."""
    path.write_text(json.dumps(chrome_trace(timeline)))
