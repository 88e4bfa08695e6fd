"""The ``--runs`` file of ``tilesim predict``: JSONL, one run per line, a JSON object with the
flags' keys (``model``, ``gpu``, ``batch``, ``seq``, ``mode``, ``framework``, ``dtype``).

Lines are read as bytes: a line that is not UTF-8 or not a JSON object is that line's error and
the other lines still run; the whole file is refused only when it cannot be read, holds no
line, or no line of it is UTF-8.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forecast.files import read_capped
from simulator.errors import ConfigError

MAX_RUNS_BYTES = 256 * 2**20  # about a million runs; /dev/zero was read until memory ran out


def read_run_lines(path: Path) -> list[bytes]:
    """The file's lines; a `ConfigError` naming ``--runs`` when none of them can be a run."""
    try:  # bytes: a line that is not UTF-8 is that line's error, not the whole file's
        raw = read_capped(path, MAX_RUNS_BYTES).splitlines()
    except OSError as e:
        raise ConfigError(f"--runs {path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise ConfigError(f"--runs {path}: {e}; split it into smaller files") from None
    if not any(line.strip() for line in raw):
        raise ConfigError(f"--runs {path}: no runs in it; give one JSON object per line")
    if not any(_utf8(line) for line in raw if line.strip()):  # not a text file at all
        raise ConfigError(f"--runs {path}: cannot read it as UTF-8 JSONL (no line is UTF-8)")
    return raw


def parse_run_line(line: bytes) -> dict[str, Any]:
    """One line as a JSON object: `UnicodeDecodeError` or `json.JSONDecodeError` where it is
    not UTF-8 JSON, a `ConfigError` where a key is given twice or it is not an object."""
    spec = json.loads(_text(line), object_pairs_hook=_unique_keys)
    if not isinstance(spec, dict):
        raise ConfigError("a run is a JSON object")
    return spec


def model_of(line: bytes) -> object:
    """A ``--runs`` line's ``model`` value, or None where the line has none to read."""
    try:
        spec = json.loads(_text(line))
    except ValueError:  # not JSON, or not UTF-8: that line's own error, later
        return None
    return spec.get("model") if isinstance(spec, dict) else None


def _text(line: bytes) -> str:
    """The line as text, without the byte-order mark an editor (Notepad) puts before a
    UTF-8 file's first line: JSON refuses it, and the first run failed for it."""
    return line.decode("utf-8-sig")


def _utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a key given twice is an error, not the last one."""
    seen = [k for i, (k, _) in enumerate(pairs) if k in (q for q, _ in pairs[:i])]
    if seen:
        raise ConfigError(f"key {seen[0]!r} given twice; give each key once")
    return dict(pairs)
