"""The ``tilesim`` command line: every subcommand is written out in `build_parser`.

Handlers parse, load, call one library function and print. Bad input raises one of the
errors in `USER_ERRORS`; `main` prints it as one line and exits 2, with no traceback.
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

from pydantic import ValidationError

from forecast.files import NotRegularFileError
from forecast.gpus import GPUError, list_gpus, load_gpu
from simulator.errors import ConfigError, InfeasibleConfig, path_arg
from simulator.kernel_commands import add_kernel_commands
from simulator.kernel_predict_commands import KERNEL_ERRORS
from simulator.models import list_models
from simulator.predict_commands import add_predict_commands
from simulator.serve_commands import add_serve_command
from simulator.simulate_commands import add_simulate_commands
from simulator.space import shipped_scenarios
from simulator.sweep_commands import add_sweep_commands
from topologies import OPS, Degradation, TopologyError, collective_estimate, load_cluster
from topologies import report as topo_report
from topologies.measured import compare, load_measured
from topologies.spec import MAX_OVERSUBSCRIPTION

# Errors that mean "the user asked for something wrong": one line, exit 2.
USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    GPUError,
    FileNotFoundError,
    NotRegularFileError,
    TopologyError,
    *KERNEL_ERRORS,
)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=None, sort_keys=False))


# --- section: kernels (forecast/) --------------------------------------------------------


def _add_kernels(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_kernel_commands(sub)


# --- section: topologies (topologies/) ---------------------------------------------------


def _add_topologies(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """collective, list, collective-plot and collective-check, in that order in --help."""
    _add_collective(sub)
    p = sub.add_parser(
        "list", help="print a catalog (gpus, servers, networks, models, scenarios) or the keys"
    )
    p.add_argument("kind", help="gpus | servers | networks | models | scenarios | keys")
    p.set_defaults(handler=_list)
    _add_collective_data(sub)


def _add_collective(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``tilesim collective``: one collective's time on a cluster, its links degraded or not."""
    p = sub.add_parser("collective", help="predict one collective on a cluster")
    p.add_argument("--op", required=True, help=" | ".join(OPS))
    p.add_argument(
        "--bytes",
        type=float,
        required=True,
        help="message size S in bytes as nccl-tests defines it (e.g. 1e9), 1 to 2^50",
    )
    p.add_argument(
        "--gpus",
        type=int,
        required=True,
        help="ranks 0..gpus-1, at least 2, filling ceil(gpus / GPUs per server) servers",
    )
    p.add_argument("--cluster", required=True, help="server id (tilesim list servers)")
    p.add_argument("--network", default=None, help="network id; default: the server's NICs")
    p.add_argument(
        "--algorithm",
        default="auto",
        help="auto (default: the fastest, as NCCL's tuner picks) | ring | tree | nvls | "
        "hierarchical | direct",
    )
    p.add_argument(
        "--degrade",
        action="append",
        default=[],
        metavar="TIER:NODE:GPU:SCALE",
        help="scale a link, e.g. inter:0:3:0.5 (the NIC node 0's GPU 3 uses, at half rate: "
        "every GPU sharing that NIC slows; intra: the GPU's NVLink, or its PCIe x16 link on a "
        "PCIe server; * = all); repeatable, and the scales of one link multiply (down to 0.001)",
    )
    p.add_argument(
        "--oversubscription",
        type=float,
        default=1.0,
        metavar="R",
        help="leaf down:up bandwidth of the fat tree, 1-64 (default: 1, non-blocking)",
    )
    p.add_argument(
        "--nodes-per-leaf",
        type=int,
        default=32,
        metavar="N",
        help="nodes under one leaf group, >= 1 (default: 32)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: time_s, algbw_GBps, busbw_GBps (GB/s = 1e9 bytes/s), "
        "algorithm",
    )
    p.set_defaults(handler=_collective)


def _add_collective_data(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that read measured busbw (nccl-tests) beside the predictions."""
    p = sub.add_parser("collective-plot", help="predicted vs measured all-reduce busbw figure")
    p.add_argument("--data", type=path_arg, required=True, help="shared/data/hardware folder")
    p.add_argument(
        "--out",
        type=path_arg,
        default=Path("busbw.png"),
        help="figure to write, PNG, PDF or SVG by its suffix (default: busbw.png)",
    )
    p.set_defaults(handler=_collective_plot)
    p = sub.add_parser("collective-check", help="measured vs predicted all-reduce busbw table")
    p.add_argument("--data", type=path_arg, required=True, help="shared/data/hardware folder")
    p.add_argument(
        "--min-bytes",
        type=float,
        default=2**20,
        help="smallest message size shown, in bytes (default: 1048576, 1 MiB)",
    )
    p.set_defaults(handler=_collective_check)


def _parse_degrade(text: str) -> Degradation:
    parts = text.split(":")
    if len(parts) != 4 or parts[0] not in ("intra", "inter"):
        raise TopologyError(f"--degrade {text!r}: use TIER:NODE:GPU:SCALE, e.g. inter:0:3:0.5")
    try:
        node, gpu = (None if x == "*" else int(x) for x in parts[1:3])
        fields = {"tier": parts[0], "node": node, "local_rank": gpu, "bw_scale": float(parts[3])}
        return Degradation.model_validate(fields)
    except (ValueError, ValidationError) as e:
        msg = f"--degrade {text!r}: NODE and GPU are integers or *, and 0.001 <= SCALE <= 1"
        raise TopologyError(msg) from e


MAX_COLLECTIVE_BYTES = 2**50  # 1 PiB: far beyond any one collective a training step runs


def _collective(args: argparse.Namespace) -> int:
    size = args.bytes
    if not (1 <= size <= MAX_COLLECTIVE_BYTES and size == int(size)):
        raise ConfigError(f"--bytes {size:g}: give a whole number of bytes from 1 to 2^50 (1 PiB)")
    if args.gpus < 2:
        raise ConfigError(
            f"--gpus {args.gpus}: a collective needs 2 or more ranks; use --gpus 2 or more"
        )
    if not (1 <= args.oversubscription <= MAX_OVERSUBSCRIPTION):  # NaN fails both
        raise ConfigError(
            f"--oversubscription {args.oversubscription:g}: give a ratio from 1 (non-blocking) "
            f"to {MAX_OVERSUBSCRIPTION:g}"
        )
    if args.nodes_per_leaf < 1:
        raise ConfigError(f"--nodes-per-leaf {args.nodes_per_leaf}: give 1 or more nodes")
    degr = tuple(_parse_degrade(d) for d in args.degrade)
    cluster = load_cluster(
        args.cluster,
        gpus=args.gpus,
        network=args.network,
        oversubscription=args.oversubscription,
        nodes_per_leaf=args.nodes_per_leaf,
        degradations=degr,
    )
    ranks = range(args.gpus)
    est = collective_estimate(args.op, args.bytes, ranks, cluster, algorithm=args.algorithm)
    too_big = _buffer_beyond_memory(args.bytes, cluster.server.gpu)
    if not args.json:
        print(topo_report.describe(est))
        if too_big:
            print(f"  does NOT fit: {too_big}")
        return 1 if too_big else 0
    _print_json(
        {
            "time_s": est.time_s,
            "algbw_GBps": est.algbw_bytes_per_s / 1e9,
            "busbw_GBps": est.busbw_bytes_per_s / 1e9,
            "algorithm": est.algorithm,
        }
    )
    if too_big:
        print(f"tilesim: does not fit: {too_big}", file=sys.stderr)
    return 1 if too_big else 0


def _buffer_beyond_memory(nbytes: float, gpu_id: str) -> str:
    """Why a collective's buffer cannot sit in one GPU's memory, or "" (also when the server
    file names a GPU outside the catalog: nothing to check against). The estimate is printed
    either way and the exit code is 1, as for a model that does not fit."""
    try:
        hbm = load_gpu(gpu_id).hbm_bytes
    except GPUError:
        return ""
    if nbytes <= hbm:
        return ""
    size = topo_report.size_text(nbytes)
    return f"its {size} buffer is more than the {hbm / 2**30:.1f} GiB of one {gpu_id}"


def _list(args: argparse.Namespace) -> int:
    if args.kind == "gpus":
        lines = [f"{gpu_id:18} {load_gpu(gpu_id).name}" for gpu_id in list_gpus()]
    elif args.kind == "servers":
        lines = topo_report.server_lines()
    elif args.kind == "networks":
        lines = topo_report.network_lines()
    elif args.kind == "models":
        lines = list_models()
    elif args.kind == "scenarios":
        lines = shipped_scenarios()
    elif args.kind == "keys":
        from simulator.scenario_keys import keys_markdown

        lines = [keys_markdown().rstrip("\n")]
    else:
        kinds = "gpus, servers, networks, models, scenarios or keys"
        raise TopologyError(f"unknown catalog {args.kind!r}; use {kinds}")
    print("\n".join(lines))
    return 0


def _collective_plot(args: argparse.Namespace) -> int:
    from simulator.figures import figure_path, save_figure  # matplotlib only when drawn
    from topologies.plots import busbw_figure

    figure_path(args.out, "--out")
    curves = load_measured(args.data)
    fig = busbw_figure(sorted({(c.server, c.gpus) for c in curves}), curves)
    print(save_figure(fig, args.out, dpi=120))
    return 0


def _collective_check(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.min_bytes) and args.min_bytes >= 0):
        raise ConfigError(f"--min-bytes {args.min_bytes:g}: give a finite size in bytes, 0 or more")
    rows = [r for c in load_measured(args.data) for r in compare(c) if r.nbytes >= args.min_bytes]
    print(topo_report.check_table(rows))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (argparse prints the whole usage block first), and
    a value that starts like a negative number is a value: ``--dims -1,64,64`` reached the
    user as "argument --dims: expected one argument" (argparse took "-1,64,64" for a flag
    unless it matched ``-N`` or ``-N.N``), not as the size rule its parser states."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d[\d,._eE+-]*$")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, one place."""
    parser = _Parser(
        prog="tilesim",
        description="Forecast GPU kernels and distributed training steps on GPUs you don't have.",
    )
    sub = cast(  # every subcommand parser is a `_Parser` (argparse makes them of its class)
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND"),
    )
    _add_kernels(sub)
    _add_topologies(sub)
    add_predict_commands(sub)
    add_serve_command(sub)
    add_simulate_commands(sub)
    add_sweep_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the exit code (0 ok, 1 infeasible, 2 bad input or a file the
    system cannot write or read, such as on a full disk, 130 interrupted)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0), or a malformed command line: one line, 2
        return e.code if isinstance(e.code, int) else 2
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except USER_ERRORS as e:
        print(f"tilesim: error: {e}", file=sys.stderr)
        return 2
    except InfeasibleConfig as e:
        print(f"tilesim: infeasible: {e.reason}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C in any command (the sweep says more about resuming)
        print("tilesim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head`: stop quietly, as Unix tools do
        _silence_stdout()
        return 0
    except OSError as e:  # a full disk, /dev/full, an I/O error: what the system said, one line
        where = f" ({e.filename})" if e.filename else ""
        fix = "; free space or give another output path" if e.errno == errno.ENOSPC else ""
        print(f"tilesim: error: {e.strerror or e}{where}{fix}", file=sys.stderr)
        _silence_stdout()  # stdout may be what failed: the last flush would fail again, loudly
        return 2


def _silence_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so that the interpreter's final flush of what
    could not be written stays quiet (no descriptor, as under pytest's capture: nothing to do)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return
    os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
