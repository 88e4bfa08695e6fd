"""The ``tilesim`` console script: imports the command line, then runs it.

Importing the command line loads torch, pandas and Ray's client (a second or two); a
Ctrl-C in that time would otherwise print a traceback from inside an import. Here it
exits 130 with one line, as a Ctrl-C inside any command does (`simulator.cli.main`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Import `simulator.cli` and run it; exit code 130 when interrupted while importing."""
    try:
        cli = importlib.import_module("simulator.cli")
    except KeyboardInterrupt:
        print("tilesim: interrupted", file=sys.stderr)
        return 130
    code: int = cli.main(argv)
    return code
