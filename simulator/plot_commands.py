"""``tilesim plot``: redraw a sweep's figures from its rows alone (no re-simulation).

The handler parses, loads the rows, calls `plots.plot_all` and prints each figure's path.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.errors import ConfigError, InfeasibleConfig
from simulator.report import RANKINGS
from simulator.saved_rows import load_rows
from simulator.sweep_folder import FIGURES, check_files, sweep_rank, sweep_study


def add_plot_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``plot``."""
    p = sub.add_parser("plot", help="redraw a sweep's figures from its rows alone")
    p.add_argument("dir", help="sweep output directory (holding rows.jsonl)")
    p.add_argument(
        "--rank",
        default=None,
        choices=sorted(RANKINGS),
        help="ranking (default: the sweep's own, from scenario.resolved.json; else tokens)",
    )
    p.set_defaults(handler=_plot)


def _plot(args: argparse.Namespace) -> int:
    if not args.dir.strip():
        raise ConfigError("plot '': an empty path; give a sweep folder (holding rows.jsonl)")
    path = Path(args.dir)
    rows = load_rows(path)
    out = path if path.is_dir() else path.parent
    check_files(out, [f"{f}.png" for f in FIGURES], f"plot {args.dir}")
    from simulator.plots import plot_all  # matplotlib only when figures are drawn

    figures = plot_all(rows, out, by=args.rank or sweep_rank(out), study=sweep_study(out))
    if not figures:  # it printed nothing and exited 0
        raise InfeasibleConfig(f"plot {args.dir}: no simulated layout fits; no figure to draw")
    for path in figures:
        print(path)
    return 0
