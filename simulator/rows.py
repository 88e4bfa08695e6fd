"""Sweep rows: one flat dict per (layout, tier), the append-only log that makes sweeps resumable.

A row has every key of `COLUMNS` (``None`` where it does not apply), so CSV columns line up.
``tier`` is ``screen`` (closed form, every layout) or ``simulate`` (execution graph, the best
candidates); ``status`` is ``ok``, ``infeasible`` (valid but does not fit; ``reason`` says
why) or ``error`` (an unexpected exception; ``reason`` holds the traceback's last line and
``error`` the traceback). Rows are appended to ``progress.jsonl`` as they arrive; a rerun reads
it back (a torn last line from an interrupt is dropped, and so are ``error`` rows: a rerun
tries those layouts again) and skips what is there, unless other code or other inputs wrote it
(``progress.meta.json`` holds their fingerprint; an unreadable one also starts afresh). The
final ``rows.jsonl`` and ``rows.parquet`` (``rows.csv`` without pyarrow) hold one row per
layout, the simulated row where there is one, sorted by ``key``; they are written whole or
not at all, and no row holds NaN or an infinity (JSON has neither). A finished sweep leaves its
log in one order (`ProgressLog.settle`: screen rows, then simulated ones, each by key), so the
same sweep leaves the same bytes whether Ray workers returned rows in another order or it was
interrupted and resumed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path
from typing import Any

from forecast.files import write_atomic, write_text_atomic
from simulator.reliability import Checkpointing, run_with_failures

Row = dict[str, Any]

# The fields of a RunConfig that a sweep varies (also the `[sweep]` keys of a layout).
RUN_KEYS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "cp_comm_type",
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
    "mfu_causal",
    "hfu",
    "hfu_causal",
    "model_tflops_per_gpu",
    "num_micro_batches",
    "graph_nodes",
    "price_per_gpu_hour",
    "power_w_per_gpu",
    "train_tokens",
    "time_to_train_s",
    "cost_usd",
    "energy_mwh",
    "goodput",
    "checkpoint_s",
    "checkpoint_interval_s",
    "error",
)
COLUMNS = LAYOUT_COLUMNS + RESULT_COLUMNS
# Columns added after rows were first written: a rows.jsonl an older tilesim wrote lacks them,
# and `saved_rows.load_rows` reads them as null there (`tilesim plot` of an older sweep).
LATER_COLUMNS = ("mfu_causal", "hfu_causal", "goodput", "checkpoint_s", "checkpoint_interval_s")
# Whole-number columns; the last two are null in screen rows, and a table column of numbers and
# nulls became floats ("8.0" in rows.csv) in one sweep and stayed whole ("8") in another.
INT_COLUMNS = (
    *("num_gpus", "tp", "pp", "dp", "cp", "micro_batch_size", "virtual_stages", "zero_stage"),
    *("num_micro_batches", "graph_nodes"),
)
SCREEN_COLUMNS = ("screen_iteration_s", "screen_tokens_per_s")
PROGRESS = "progress.jsonl"


def blank_row(**values: Any) -> Row:
    """A row with every column, ``None`` unless given."""
    row: Row = dict.fromkeys(COLUMNS)
    row.update(values)
    return row


def train_steps(train_tokens: float, tokens_per_step: int) -> int:
    """Optimizer steps to train ``train_tokens``: a run takes whole steps, so the last one is
    taken whole, ceil(budget / tokens per step) (exact: the fraction of two floats' quotient
    could round an almost-whole count down)."""
    return math.ceil(Fraction(train_tokens) / tokens_per_step)


def add_training_cost(
    row: Row, *, tokens_per_step: int, checkpointing: Checkpointing | None = None
) -> Row:
    """Fill time to train, cost and energy: `train_steps` whole steps of the row's step time
    (``tokens_per_step`` = global batch x sequence length), then GPU-hours x price and x power.
    The budget over tokens/s counted a fraction of a last step no run can take. With
    ``checkpointing`` the time is the expected wall time of those steps with interruptions,
    checkpoints and restarts (`simulator.reliability`), paid for and powered throughout, and
    the row has its goodput and checkpoint interval."""
    step_s, tokens = row.get("iteration_s"), row.get("train_tokens")
    if not step_s or not row.get("tokens_per_s") or not tokens:
        return row
    seconds = train_steps(tokens, tokens_per_step) * step_s
    if checkpointing is not None:
        run = run_with_failures(seconds, checkpointing)
        seconds = run.wall_s
        row["goodput"] = run.goodput
        row["checkpoint_s"] = checkpointing.checkpoint_s
        row["checkpoint_interval_s"] = run.interval_s
    gpu_hours = seconds / 3600.0 * row["num_gpus"]
    row["time_to_train_s"] = seconds
    if row.get("price_per_gpu_hour") is not None:
        row["cost_usd"] = gpu_hours * row["price_per_gpu_hour"]
    if row.get("power_w_per_gpu") is not None:
        row["energy_mwh"] = gpu_hours * row["power_w_per_gpu"] / 1e6
    return row


def read_jsonl(path: Path) -> list[Row]:
    """The JSON-object lines of a file; any other line (a line torn by an interrupted write,
    bytes that are not UTF-8, a value that is not an object) is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_bytes().splitlines():
        try:
            row = json.loads(line.decode())
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def dumps_row(row: Row) -> str:
    """One JSON line; NaN and infinity are refused (`finite_problem` keeps them out of rows)."""
    return json.dumps(row, allow_nan=False) + "\n"


def finite_problem(row: Row) -> str | None:
    """The first column holding NaN or an infinity (JSON has neither), or None."""
    for k, v in row.items():
        if isinstance(v, float) and not math.isfinite(v):
            return f"{k} = {v}"
    return None


TIERS = ("screen", "simulate")
STATUSES = ("ok", "infeasible", "error")
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
        A log written under another ``fingerprint`` (`code_fingerprint`), or whose
        ``progress.meta.json`` cannot be read, is started afresh, and ``stale`` says so."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / PROGRESS
        meta = out_dir / PROGRESS_META
        self.stale = self.path.exists() and _logged_fingerprint(meta) != fingerprint
        if self.stale:
            self.path.unlink()
        write_text_atomic(meta, json.dumps({"fingerprint": fingerprint}) + "\n")
        # error rows are not resumed: a rerun tries those layouts again (a worker that died of
        # memory, a fixed bug), as a fresh folder would, instead of reporting the old failure
        rows = [r for r in read_jsonl(self.path) if _is_logged_row(r) and r["status"] != "error"]
        self.done: dict[tuple[str, str], Row] = {(r["key"], r["tier"]): r for r in rows}
        self._rewrite()

    def _rewrite(self) -> None:
        """Write the log as ``done`` holds it (whole or not at all), unless it already is."""
        text = "".join(dumps_row(r) for r in self.done.values())
        if not self.path.exists() or self.path.read_bytes() != text.encode():
            write_text_atomic(self.path, text)

    def settle(self) -> None:
        """Put the log in its one order, screen rows then simulated ones, each by key: rows
        are appended as they arrive, so a Ray sweep's log (and a resumed one's) came out in
        another order from run to run than the serial run's."""
        order = sorted(self.done, key=lambda kt: (TIERS.index(kt[1]), kt[0]))
        self.done = {kt: self.done[kt] for kt in order}
        self._rewrite()

    def has(self, key: str, tier: str) -> bool:
        """True when this layout's row of this tier is already in the log."""
        return (key, tier) in self.done

    def append(self, rows: Iterable[Row]) -> None:
        """Append rows and flush, so an interrupt loses at most the line being written."""
        new = [r for r in rows if (r["key"], r["tier"]) not in self.done]
        with self.path.open("a") as f:
            for r in new:
                f.write(dumps_row(r))
                self.done[(r["key"], r["tier"])] = r
            f.flush()

    def rows(self, tier: str) -> list[Row]:
        """Logged rows of one tier, sorted by key."""
        return sorted((r for (_, t), r in self.done.items() if t == tier), key=lambda r: r["key"])


def _logged_fingerprint(meta: Path) -> str | None:
    """The fingerprint noted in ``progress.meta.json``; None when missing or unreadable."""
    try:
        noted = json.loads(meta.read_bytes().decode())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return noted.get("fingerprint") if isinstance(noted, dict) else None


def _is_logged_row(row: Row) -> bool:
    """A row the log can index (a foreign line without a string key and tier is dropped)."""
    return isinstance(row.get("key"), str) and row.get("tier") in TIERS


def final_rows(log: ProgressLog, screened: Iterable[str], simulated: Iterable[str]) -> list[Row]:
    """One row per layout: the simulated one where it exists, else the screen's; by key.
    ``screened`` and ``simulated`` (keys) keep only this sweep's layouts and candidates, so
    rows a rerun with other settings left in the log (a larger ``--candidates``) do not count."""
    keep_screen, keep_sim = set(screened), set(simulated)
    merged = {r["key"]: r for r in log.rows("screen") if r["key"] in keep_screen}
    for r in log.rows("simulate"):
        if r["key"] not in keep_sim:
            continue
        screened_row = merged.get(r["key"], {})
        merged[r["key"]] = r | {k: screened_row[k] for k in SCREEN_COLUMNS if k in screened_row}
    return [merged[k] for k in sorted(merged)]


def write_rows(rows: list[Row], out_dir: Path) -> list[Path]:
    """Write ``rows.jsonl`` and ``rows.parquet`` (or ``rows.csv`` without pyarrow), each whole
    or not at all."""
    import pandas as pd

    jsonl = out_dir / "rows.jsonl"
    write_text_atomic(jsonl, "".join(dumps_row(r) for r in rows))
    frame = pd.DataFrame(rows, columns=list(COLUMNS)).drop(columns=["error"])
    frame = frame.astype(dict.fromkeys(INT_COLUMNS, "Int64"))  # whole numbers, nulls empty
    if importlib.util.find_spec("pyarrow") is not None:
        table = out_dir / "rows.parquet"
        write_atomic(table, lambda tmp: frame.to_parquet(tmp, index=False))
    else:
        table = out_dir / "rows.csv"
        write_atomic(table, lambda tmp: frame.to_csv(tmp, index=False))
    return [jsonl, table]
