"""The ``tilesim`` command line: every subcommand is written out in `build_parser`.

Handlers parse, load, call one library function and print. Bad input raises one of the
errors in `USER_ERRORS`; `main` prints it as one line and exits 2, with no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from forecast.gpus import GPUError
from simulator.errors import ConfigError, InfeasibleConfig

# Errors that mean "the user asked for something wrong": one line, exit 2.
USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, GPUError, FileNotFoundError)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=None, sort_keys=False))


# --- section: kernels (forecast/) --------------------------------------------------------


def _add_kernels(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("kernels", help="single-GPU kernel latency: predict, eval, train")
    ksub = p.add_subparsers(dest="kernels_cmd", required=True)
    del ksub  # filled in by the forecaster


# --- section: topologies (topologies/) ---------------------------------------------------


def _add_topologies(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    del sub  # filled in by the topologies work


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, one place."""
    parser = argparse.ArgumentParser(
        prog="tilesim",
        description="Forecast GPU kernels and distributed training steps on GPUs you don't have.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_kernels(sub)
    _add_topologies(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the exit code (0 ok, 1 infeasible, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except USER_ERRORS as e:
        print(f"tilesim: error: {e}", file=sys.stderr)
        return 2
    except InfeasibleConfig as e:
        print(f"tilesim: infeasible: {e.reason}", file=sys.stderr)
        return 1
