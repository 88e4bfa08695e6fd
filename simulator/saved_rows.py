"""A finished sweep's rows read back for `tilesim plot` and reports: `load_rows` checks that
every line is a row `tilesim sweep` could have written (the columns of `rows.COLUMNS`, each
of its kind, no NaN), so a hand-edited or foreign file is one clear error, not a traceback
from inside a figure. A row an older tilesim wrote, without a column added since
(`rows.LATER_COLUMNS`), reads as null there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError
from simulator.rows import (
    COLUMNS,
    INT_COLUMNS,
    LATER_COLUMNS,
    LAYOUT_COLUMNS,
    STATUSES,
    TIERS,
    Row,
)

_TEXT = {"key", "option", "context", "gpu", "server", "network", "schedule", "recompute"}
_TEXT |= {"cp_comm_type"}
_FLAGS = {"sequence_parallel", "distributed_optimizer", "fits"}
_COUNTS = {"num_gpus", "tp", "pp", "dp", "cp", "micro_batch_size", "virtual_stages"}
_INTS = set(INT_COLUMNS)
# What the figures and the report read from a row of status ok, per tier.
_OK_NEEDS = {
    "screen": ("screen_iteration_s", "screen_tokens_per_s", "memory_gib_per_gpu"),
    "simulate": (
        *("iteration_s", "tokens_per_s", "memory_gib_per_gpu", "optimizer_s", "mfu"),
        *("bubble_fraction", "exposed_tp_s", "exposed_cp_s", "exposed_ep_s", "exposed_pp_s"),
        "exposed_dp_s",
    ),
}


def _row_problem(row: Any) -> str | None:
    """What makes a parsed line no sweep row (not an object, a column missing, an unknown
    tier or status, a value no sweep writes: a text where a number goes, a negative time, a
    null layout or result of an ok row), or None."""
    missing = [c for c in COLUMNS if c not in row] if isinstance(row, dict) else None
    if missing is None or missing:
        return f"lacks {', '.join(missing[:3])}" if missing else "is not a JSON object"
    if row["tier"] not in TIERS or row["status"] not in STATUSES:
        return f"tier {row['tier']!r}, status {row['status']!r}"
    needed = {*LAYOUT_COLUMNS, *(_OK_NEEDS[row["tier"]] if row["status"] == "ok" else ())}
    for k in COLUMNS:
        v = row[k]
        if v is None:
            if k in needed:
                return f"{k} is null"
            continue
        number = isinstance(v, int | float) and not isinstance(v, bool)
        if k in _TEXT or k in ("tier", "status", "reason", "error"):
            good = isinstance(v, str)
        elif k in _FLAGS:
            good = isinstance(v, bool)
        else:
            good = number and v >= (1 if k in _COUNTS else 0) and (k not in _INTS or v == int(v))
        if not good:
            return f"{k} = {json.dumps(v)}"
    return None


def _upgraded(row: Any) -> Any:
    """A row an older tilesim wrote, before a column was added (`LATER_COLUMNS`), with that
    column null (`tilesim plot` of an older sweep); anything else as it is."""
    return {**dict.fromkeys(LATER_COLUMNS), **row} if isinstance(row, dict) else row


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def load_rows(out_dir: Path) -> list[Row]:
    """The final rows of a sweep directory (``rows.jsonl``), for plots and reports. Anything
    but `tilesim sweep` rows (another file, bytes that are not UTF-8 JSON, a line without the
    row columns, NaN) is a `ConfigError` naming the file and line."""
    path = out_dir / "rows.jsonl" if out_dir.is_dir() else out_dir
    if not path.exists():
        raise FileNotFoundError(f"{path}: no rows (run `tilesim sweep` first)")
    if not path.is_file():
        raise ConfigError(f"{path}: not a file; give a sweep folder or its rows.jsonl")
    if path.name != "rows.jsonl":  # progress.jsonl is the sweep's log: both tiers, reruns
        raise ConfigError(f"{path}: not a rows.jsonl; give a sweep folder or its rows.jsonl")
    fix = "give a folder written by `tilesim sweep` (or rerun the sweep)"
    try:
        lines = path.read_bytes().decode().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read it as UTF-8 JSON lines ({e}); {fix}") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = _upgraded(json.loads(line, parse_constant=_refuse_constant))
        except ValueError as e:
            raise ConfigError(f"{path}:{n}: not a JSON row ({e}); {fix}") from None
        problem = _row_problem(row)
        if problem is not None:
            raise ConfigError(f"{path}:{n}: not a sweep row ({problem}); {fix}")
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"{path}: no rows (run `tilesim sweep` first)")
    return rows
