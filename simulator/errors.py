"""Errors that the CLI turns into one line and exit code 2 (bad input) or 1 (cannot run)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from forecast.files import NOT_REGULAR, is_special_file


class ConfigError(ValueError):
    """Bad user input: the message names the field and the fix."""


class InfeasibleConfig(Exception):  # noqa: N818 (a result, not a bug: calculon's Llm.Error)
    """A valid configuration that cannot run (does not fit, does not divide)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# pydantic's type errors -> what the value must be ("Input should be a valid integer" named
# neither the value given nor the fix)
_WANTED = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string in quotes",
}


def pydantic_msg(error: Mapping[str, Any]) -> str:
    """The message of one of pydantic's ``ValidationError.errors()``, without the ``Value
    error, `` prefix it puts before a validator's own text; a value of the wrong type says
    what it must be and what it got (`_WANTED`)."""
    if error.get("type") == "string_too_short":
        return "must not be empty; give a value (or leave an optional key out)"
    want = _WANTED.get(str(error.get("type")))
    if want is None:
        return str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    got = json.dumps(value) if isinstance(value, str | bool | int | float) else type(value).__name__
    quoted = isinstance(value, str) and want != _WANTED["string_type"]
    return f"must be {want}, got {got}" + ("; write it without quotes" if quoted else "")


def at_least(flag: str, value: float, lo: float) -> None:
    """Raise `ConfigError` naming ``flag`` unless ``value >= lo``."""
    if value < lo:
        raise ConfigError(f"{flag} must be at least {lo}, got {value}")


def path_arg(text: str) -> Path:
    """An argparse ``type`` for a path flag: an empty text (an unset shell variable) is one
    error naming the flag, not ``Path("")``, which is the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give a file or folder name")
    return Path(text)


def cannot_write_in(folder: Path) -> str | None:
    """None when a file can be created in ``folder``, else the system's reason. It creates
    (and removes) one: `os.access` says yes to root even where the system refuses (/sys, a
    read-only mount), and the refusal came after the work, as a traceback."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def refuse_special_file(path: Path, label: str) -> None:
    """A `ConfigError` starting with ``label`` when ``path`` exists and is neither a regular
    file nor a folder (a device such as /dev/full, a pipe, /dev/stdout): the whole-or-nothing
    write renames a new file over it, which replaced the device itself (as root) or failed
    after all the work."""
    if is_special_file(path):
        raise ConfigError(f"{label}: {path} {NOT_REGULAR}")


def check_writable_above(path: Path, label: str) -> Path:
    """The nearest existing folder at or above ``path`` (the one a write there would create
    its folders in); a `ConfigError` starting with ``label`` unless a file can be made in it."""
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{label}: {parent} is not a writable folder; give another path")
    why = cannot_write_in(parent)
    if why:
        raise ConfigError(f"{label}: cannot write in {parent} ({why}); give another path")
    return parent


def add_set_option(p: argparse.ArgumentParser, example: str) -> None:
    """``--set TABLE.KEY=VALUE``, repeatable, as `tilesim simulate` and `tilesim sweep` take it
    (``example``: one or two overrides that command's users write)."""
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="TABLE.KEY=VALUE",
        help=f"override one scenario key, e.g. {example} (repeatable; values in TOML syntax)",
    )
