"""``tilesim plot``: redraw a sweep's figures from its rows alone (no re-simulation).

The handler parses, loads the rows, calls `plots.plot_all` and prints each figure's path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simulator.errors import ConfigError, InfeasibleConfig, at_least
from simulator.report import RANKINGS, TOP_K
from simulator.saved_rows import load_rows
from simulator.sweep_folder import FIGURES, check_files, sweep_rank, sweep_study, sweep_top

UNKNOWN_STUDY = "unknown study"  # a title's study where the folder names none


def add_plot_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``plot``."""
    p = sub.add_parser("plot", help="redraw a sweep's figures from its rows alone")
    p.add_argument("dir", help="sweep output directory (holding rows.jsonl)")
    p.add_argument(
        "--rank",
        default=None,
        choices=sorted(RANKINGS),
        help="ranking (default: the sweep's own, from scenario.resolved.json or report.md; "
        "else tokens)",
    )
    p.add_argument(
        "--top",
        type=int,
        default=None,
        help="layouts in the top-layouts figure (default: the sweep's own --top, from "
        f"scenario.resolved.json or report.md; else {TOP_K})",
    )
    p.set_defaults(handler=_plot)


def _plot(args: argparse.Namespace) -> int:
    if not args.dir.strip():
        raise ConfigError("plot '': an empty path; give a sweep folder (holding rows.jsonl)")
    if args.top is not None:
        at_least("--top", args.top, 1)
    path = Path(args.dir)
    if not path.exists():  # it read "no rows (run `tilesim sweep` first)", as if swept there
        raise FileNotFoundError(f"{path}: no such folder or file; give a sweep's folder")
    rows = load_rows(path)
    out = path if path.is_dir() else path.parent
    check_files(out, [f"{f}.png" for f in FIGURES], f"plot {args.dir}")
    study = sweep_study(out)
    from simulator.plots import plot_all  # matplotlib only when figures are drawn

    by, top = args.rank or sweep_rank(out), args.top or sweep_top(out)
    figures = plot_all(rows, out, by=by, study=study or UNKNOWN_STUDY, top=top)
    if not figures:  # it printed nothing and exited 0
        raise InfeasibleConfig(f"plot {args.dir}: no simulated layout fits; no figure to draw")
    if not study:  # the titles named no study, as if the figures were of none
        print(
            f"tilesim: {out} has no scenario.resolved.json or report.md naming the study; "
            f"the figures' titles say {UNKNOWN_STUDY!r}",
            file=sys.stderr,
        )
    for path in figures:
        print(path)
    return 0
