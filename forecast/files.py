"""Writes that leave a whole file or none: an interrupt (Ctrl-C, a full disk) never leaves a
half-written result where a later run would read it. The lowest layer of the project, so
`simulator` uses these too."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

NOT_REGULAR = "is not a regular file (a device, pipe or socket); give a file path"


MAX_TOML_BYTES = 16 * 2**20  # a GPU, model or scenario file is a few KB


def read_capped(path: Path, limit_bytes: int) -> bytes:
    """At most ``limit_bytes`` of ``path``, or `ValueError` where it holds more: /dev/zero or
    an endless pipe was read until memory ran out (a pipe, such as ``<(...)``, is still read)."""
    with path.open("rb") as f:
        data = f.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise ValueError(f"it holds more than {limit_bytes / 2**20:g} MiB")
    return data


def read_toml(path: Path, what: str, error: type[Exception]) -> dict[str, Any]:
    """A TOML file's table, or ``error`` with one line naming ``what`` it is and why it cannot
    be read (missing, unreadable, over `MAX_TOML_BYTES`, not UTF-8, not TOML): GPU, model and
    scenario files alike. A UTF-8 byte-order mark (some Windows editors write one) is skipped."""
    try:
        text = read_capped(path, MAX_TOML_BYTES).decode("utf-8-sig")
        return tomllib.loads(text)
    except (OSError, ValueError) as e:  # UnicodeDecodeError and TOMLDecodeError among them
        raise error(f"cannot read {what} {path} as TOML (UTF-8): {e}") from e


def find_relative(ref: str, folder: Path) -> str | None:
    """Where a relative file path that another file names is read: from that file's
    ``folder`` first, then from the current folder (as before there was a rule); None where
    neither holds it. An absolute path, or an existing folder, is returned as it is (its
    reader says what is wrong with it)."""
    path = Path(ref)
    if path.is_absolute():
        return ref
    beside = folder / path
    if beside.exists():
        return str(beside)
    return ref if path.exists() else None


def is_special_file(path: Path) -> bool:
    """Whether ``path`` exists as neither a regular file nor a folder (a device such as
    /dev/full, a pipe, /dev/stdout): renaming a new file over it would replace it."""
    return path.exists() and not path.is_file() and not path.is_dir()


class NotRegularFileError(OSError):
    """A write target that exists but is a device, pipe or socket (/dev/full, /dev/stdout):
    renaming a new file over it would replace the device itself."""


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Write a whole file or nothing: ``write`` fills a temporary file beside ``path``, which
    is then renamed over it, so an interrupt never leaves a half-written one (nor, when
    ``write`` fails or is interrupted, the temporary file). A symbolic link is written
    through: its target gets the file and the link stays (renaming over the link replaced it,
    /dev/stdout included, with a plain file)."""
    write_together([(path.resolve() if path.is_symlink() else path, write)])


def write_text_atomic(path: Path, text: str) -> None:
    """`write_atomic` of a text."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_together(writes: Sequence[tuple[Path, Callable[[Path], object]]]) -> None:
    """Several files of one folder that belong together (weights, tables, manifest): each is
    written to its temporary file first, and only when all are written are they renamed over
    the old ones, in the order given (put the file that marks the set complete last). An
    interrupt while writing leaves the old set untouched and no temporary file."""
    for path, _ in writes:  # checked first: nothing is written when one cannot be
        if is_special_file(path):
            raise NotRegularFileError(f"{path} {NOT_REGULAR}")
    # a fresh folder beside the first file (same file system, so the renames are atomic);
    # each file keeps its own name there (torch.save records it inside the archive)
    stage = Path(tempfile.mkdtemp(prefix=".partial-", dir=writes[0][0].parent))
    staged = [(path, stage / path.name) for path, _ in writes]
    try:
        for (_, write), (_, tmp) in zip(writes, staged, strict=True):
            write(tmp)
        for path, tmp in staged:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def read_json(path: Path, error: type[Exception], what: str, fix: str) -> Any:
    """The parsed JSON of ``path``; an ``error`` of one line naming the file, ``what`` it
    should hold and the ``fix`` when it is missing, unreadable, not UTF-8 or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise error(f"cannot read {path} as {what} ({e}); {fix}") from None
