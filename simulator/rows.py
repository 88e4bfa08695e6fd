"""Sweep rows: one flat dict per (layout, tier), the append-only log that makes sweeps resumable.

A row has every key of `COLUMNS` (``None`` where it does not apply), so CSV columns line up.
``tier`` is ``screen`` (closed form, every layout) or ``simulate`` (execution graph, the best
candidates); ``status`` is ``ok``, ``infeasible`` (valid but does not fit; ``reason`` says
why) or ``error`` (an unexpected exception; ``reason`` holds the traceback's last line and
``error`` the traceback). Rows are appended to ``progress.jsonl`` as they arrive; a rerun reads
it back (a torn last line from an interrupt is dropped) and skips what is there, unless other
code wrote it (``progress.meta.json`` holds the code's fingerprint). The final
``rows.jsonl`` and ``rows.parquet`` (``rows.csv`` without pyarrow) hold one row per layout,
the simulated row where there is one, sorted by ``key``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Row = dict[str, Any]

# The fields of a RunConfig that a sweep varies (also the `[sweep]` keys of a layout).
RUN_KEYS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "micro_batch_size",
    "schedule",
    "virtual_stages",
    "sequence_parallel",
    "recompute",
    "zero_stage",
    "distributed_optimizer",
)
LAYOUT_COLUMNS = ("key", "option", "context", "gpu", "server", "network", "num_gpus", *RUN_KEYS)
RESULT_COLUMNS = (
    "tier",
    "status",
    "reason",
    "screen_iteration_s",
    "screen_tokens_per_s",
    "memory_gib_per_gpu",
    "fits",
    "iteration_s",
    "tokens_per_s",
    "forward_backward_s",
    "optimizer_s",
    "bubble_fraction",
    "exposed_tp_s",
    "exposed_cp_s",
    "exposed_ep_s",
    "exposed_pp_s",
    "exposed_dp_s",
    "mfu",
    "hfu",
    "model_tflops_per_gpu",
    "num_micro_batches",
    "graph_nodes",
    "price_per_gpu_hour",
    "power_w_per_gpu",
    "train_tokens",
    "time_to_train_s",
    "cost_usd",
    "energy_mwh",
    "error",
)
COLUMNS = LAYOUT_COLUMNS + RESULT_COLUMNS
SCREEN_COLUMNS = ("screen_iteration_s", "screen_tokens_per_s")
PROGRESS = "progress.jsonl"


def blank_row(**values: Any) -> Row:
    """A row with every column, ``None`` unless given."""
    row: Row = dict.fromkeys(COLUMNS)
    row.update(values)
    return row


def add_training_cost(row: Row) -> Row:
    """Fill time to train, cost and energy from tokens/s, the token budget, price and power."""
    tps, tokens = row.get("tokens_per_s"), row.get("train_tokens")
    if not tps or not tokens:
        return row
    seconds = tokens / tps
    gpu_hours = seconds / 3600.0 * row["num_gpus"]
    row["time_to_train_s"] = seconds
    if row.get("price_per_gpu_hour") is not None:
        row["cost_usd"] = gpu_hours * row["price_per_gpu_hour"]
    if row.get("power_w_per_gpu") is not None:
        row["energy_mwh"] = gpu_hours * row["power_w_per_gpu"] / 1e6
    return row


def read_jsonl(path: Path) -> list[Row]:
    """Rows of a JSONL file; a torn last line (interrupted write) is ignored."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


PROGRESS_META = "progress.meta.json"
_CODE_DIRS = ("forecast", "simulator", "topologies")
_CODE_SUFFIXES = (".py", ".json", ".toml", ".pt", ".npz")  # code, catalogs, weights, tile tables


def code_fingerprint() -> str:
    """A hash of the code and committed weights that produce rows: a log written by other code
    (an upgraded tilesim, retrained weights) must not be resumed as if it were this one's."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for d in _CODE_DIRS:
        for path in sorted((root / d).rglob("*")):
            if path.suffix in _CODE_SUFFIXES and path.name != "validation.json" and path.is_file():
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


class ProgressLog:
    """The append-only ``progress.jsonl`` of one sweep directory."""

    def __init__(self, out_dir: Path, fingerprint: str = "") -> None:
        """Open (creating) the log; drop a torn last line so appends start on a clean line.
        A log written under another ``fingerprint`` (`code_fingerprint`) is started afresh, and
        ``stale`` says so."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / PROGRESS
        meta = out_dir / PROGRESS_META
        old = json.loads(meta.read_text()).get("fingerprint") if meta.is_file() else None
        self.stale = self.path.exists() and old != fingerprint
        if self.stale:
            self.path.unlink()
        meta.write_text(json.dumps({"fingerprint": fingerprint}) + "\n")
        rows = read_jsonl(self.path)
        self.done: dict[tuple[str, str], Row] = {(r["key"], r["tier"]): r for r in rows}
        text = "".join(json.dumps(r) + "\n" for r in self.done.values())
        if not self.path.exists() or self.path.read_text() != text:
            self.path.write_text(text)

    def has(self, key: str, tier: str) -> bool:
        """True when this layout's row of this tier is already in the log."""
        return (key, tier) in self.done

    def append(self, rows: Iterable[Row]) -> None:
        """Append rows and flush, so an interrupt loses at most the line being written."""
        new = [r for r in rows if (r["key"], r["tier"]) not in self.done]
        with self.path.open("a") as f:
            for r in new:
                f.write(json.dumps(r) + "\n")
                self.done[(r["key"], r["tier"])] = r
            f.flush()

    def rows(self, tier: str) -> list[Row]:
        """Logged rows of one tier, sorted by key."""
        return sorted((r for (_, t), r in self.done.items() if t == tier), key=lambda r: r["key"])


def final_rows(log: ProgressLog) -> list[Row]:
    """One row per layout: the simulated one where it exists, else the screen's; by key."""
    merged = {r["key"]: r for r in log.rows("screen")}
    for r in log.rows("simulate"):
        screened = merged.get(r["key"], {})
        merged[r["key"]] = r | {k: screened[k] for k in SCREEN_COLUMNS if k in screened}
    return [merged[k] for k in sorted(merged)]


def write_rows(rows: list[Row], out_dir: Path) -> list[Path]:
    """Write ``rows.jsonl`` and ``rows.parquet`` (or ``rows.csv`` without pyarrow)."""
    import pandas as pd

    jsonl = out_dir / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    frame = pd.DataFrame(rows, columns=list(COLUMNS)).drop(columns=["error"])
    if importlib.util.find_spec("pyarrow") is not None:
        table = out_dir / "rows.parquet"
        frame.to_parquet(table, index=False)
    else:
        table = out_dir / "rows.csv"
        frame.to_csv(table, index=False)
    return [jsonl, table]


def load_rows(out_dir: Path) -> list[Row]:
    """The final rows of a sweep directory (``rows.jsonl``), for plots and reports."""
    path = out_dir / "rows.jsonl" if out_dir.is_dir() else out_dir
    rows = read_jsonl(path)
    if not rows:
        raise FileNotFoundError(f"{path}: no rows (run `tilesim sweep` first)")
    return rows
