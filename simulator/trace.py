"""Timeline -> Chrome trace JSON (chrome://tracing, ui.perfetto.dev).

One process per pipeline stage (one representative GPU), one thread per stream (compute, pp,
dp, dp-gather); complete events (``ph = "X"``) in microseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
                "name": a["label"],
                "cat": a.get("comm", a["kind"]),
                "ph": "X",
                "pid": a["stage"],
                "tid": STREAM_TIDS.get(a["stream"], 9),
                "ts": timeline.start_s[node] * 1e6,
                "dur": a["duration_s"] * 1e6,
                "args": args,
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
