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
    for node, a in timeline.graph.nodes.items():
        stages.add(a["stage"])
        if a["duration_s"] <= 0:
            continue
        args = {k: a[k] for k in ("tp_s", "cp_s", "ep_s") if k in a and a[k] > 0}
        events.append(
            {
                "name": task_label(node),
                "cat": a.get("comm", a["kind"]),
                "ph": "X",
                "pid": a["stage"],
                "tid": STREAM_TIDS.get(a["stream"], 9),
                "ts": timeline.start_s[node] * 1e6,
                "dur": a["duration_s"] * 1e6,
                "args": args,
            }
        )
    for (src, _dst), e in timeline.graph.edges.items():
        if e.get("delay_s", 0.0) > 0:
            a = timeline.graph.nodes[src]
            t = timeline.end_s[src]
            events.append(
                {
                    "name": f"send {task_label(src)}",
                    "cat": e["comm"],
                    "ph": "X",
                    "pid": a["stage"],
                    "tid": STREAM_TIDS[e["comm"]],
                    "ts": t * 1e6,
                    "dur": e["delay_s"] * 1e6,
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
