"""``tilesim kernels collect`` (time kernels on this machine) and ``kernels tc-calibrate``.

`forecast.profile` is imported inside the handler only: it is the one module that times a
device, and nothing else imports it. ``--op gemm --dims M,N,K`` (``kernels predict``) means
``C[M,N] = A[M,K] B[K,N]`` and maps to a ``bmm`` KernelSpec with ``B = 1``: dims
``(1, M, K, N)`` (bmm's third dim is the reduction), so no bias is counted.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from pathlib import Path

from forecast.collect_plan import DTYPES
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.tc_calibrate import DEFAULT_DATA_DIR as TC_DATA_DIR
from simulator.errors import (
    ConfigError,
    at_least,
    cannot_write_in,
    path_arg,
    refuse_special_file,
)

MAX_DIM = 2**40  # one kernel dimension: past it the forecasters' int64 arrays overflow


def check_dims(dims: tuple[int, ...], text: str) -> tuple[int, ...]:
    """``dims`` unless one is above `MAX_DIM` (a `ConfigError` naming ``--dims``)."""
    if any(d > MAX_DIM for d in dims):
        raise ConfigError(f"--dims {text!r}: each size at most 2^40 ({MAX_DIM}); give smaller dims")
    return dims


def parse_dims(text: str) -> tuple[int, ...]:
    """``--dims`` as whole numbers from 1 to `MAX_DIM`, else a `ConfigError` naming the size
    (a 0 was reported as the kernel's internal tuple, ``got (1, 0, 10, 10)`` for a gemm)."""
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(
            f"--dims {text!r}: give comma-separated positive whole numbers, e.g. 1024,1024,1024"
        ) from None
    bad = [d for d in dims if d < 1]
    if bad:
        raise ConfigError(
            f"--dims {text!r}: each size must be a positive whole number, got {bad[0]}"
        )
    return check_dims(dims, text)


def gemm_kernel(dims_text: str, dtype: str) -> KernelSpec:
    """``M,N,K`` (K the reduction) -> ``bmm (1, M, K, N)``; a `ConfigError` if malformed."""
    m, n, k = parse_dims(dims_text)
    return KernelSpec(OpFamily.BMM, (1, m, k, n), Dtype(dtype))


def add_collect_commands(ksub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``kernels collect`` and ``kernels tc-calibrate``."""
    _add_collect(ksub)
    _add_tc_calibrate(ksub)


def _add_collect(ksub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = ksub.add_parser("collect", help="time kernels with PyTorch into a measurements CSV")
    c.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="where to time (default: cuda)"
    )
    c.add_argument("--ops", default=None, help="comma list; default: every op of the collector")
    c.add_argument(
        "--dtypes", default=None, help=f"comma list of {','.join(DTYPES)} (default: all)"
    )
    c.add_argument("--out", type=path_arg, required=True, help="CSV to write or resume")
    c.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop after this many seconds (default: no limit)",
    )
    c.add_argument(
        "--repeats",
        type=int,
        default=10,
        help="timed calls per kernel, the median kept (default: 10)",
    )
    c.set_defaults(handler=_collect)


def _add_tc_calibrate(ksub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = ksub.add_parser("tc-calibrate", help="fit the tensor-core model; print the holdout table")
    t.add_argument(
        "--data",
        type=path_arg,
        default=None,
        help=f"folder with microbenchmarks.json (default: {TC_DATA_DIR})",
    )
    t.add_argument(
        "--holdout",
        default="h200-sxm-141gb",
        help="GPU id kept out, or 'none' (default: %(default)s)",
    )
    t.add_argument(
        "--measured",
        type=path_arg,
        nargs="+",
        default=[],
        metavar="CSV",
        help="CSVs from `kernels collect` on a GPU (tensor-core GEMMs, FA2 forwards) to add",
    )
    t.add_argument("--write", action="store_true", help="write forecast/data/tensor_core.toml")
    t.add_argument("--json", action="store_true", help="print JSON rows")
    t.set_defaults(handler=_tc_calibrate)


def _choices(text: str | None, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
    if text is None:
        return allowed
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        what = f"unknown {', '.join(bad)}" if bad else "empty"
        raise ConfigError(f"{flag}: {what}; use {','.join(allowed)}")
    return items


def _check_resumable(out: Path, columns: tuple[str, ...]) -> None:
    """An existing ``--out`` is resumed (rows appended): refuse one this command did not write
    (another CSV, a JSON, an empty or non-UTF-8 file), which it would corrupt or crash on."""
    if not out.exists():
        return
    fix = "give a new file name, or a CSV this command wrote to resume it"
    try:
        with out.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"--out {out}: cannot read it as a UTF-8 CSV ({e}); {fix}") from None
    if header != list(columns):
        what = "an empty file" if header is None else "its header is not the collector's"
        raise ConfigError(f"--out {out}: not a `tilesim kernels collect` CSV ({what}); {fix}")


def _check_out(out: Path) -> None:
    """``--out`` and its metadata file can be written: neither a device nor a folder, in a
    folder this run can write in (checked before any kernel is timed, instead of a raw
    ``[Errno 2] ... .partial-*`` after the first ones)."""
    if out.is_dir() or not out.parent.is_dir():
        why = "is a folder" if out.is_dir() else f"needs the folder {out.parent}"
        raise ConfigError(f"--out {out} {why}; give a CSV path in an existing folder")
    meta = out.with_suffix(".meta.json")
    if meta.is_dir():
        raise ConfigError(f"--out {out}: {meta} (its metadata file) is a folder; move it")
    refuse_special_file(out, "--out")
    refuse_special_file(meta, f"--out {out}: its metadata file")
    refusal = cannot_write_in(out.parent)
    if refusal:
        raise ConfigError(
            f"--out {out}: cannot write in {out.parent} ({refusal}); give another path"
        )


def _collect(args: argparse.Namespace) -> int:
    from forecast import collect_rows, profile

    at_least("--repeats", args.repeats, 1)
    if args.budget_s is not None and not (math.isfinite(args.budget_s) and args.budget_s > 0):
        raise ConfigError(f"--budget-s must be a positive number of seconds, got {args.budget_s}")
    if args.out.is_dir() or not args.out.parent.is_dir():
        why = "is a folder" if args.out.is_dir() else f"needs the folder {args.out.parent}"
        raise ConfigError(f"--out {args.out} {why}; give a CSV path in an existing folder")
    _check_out(args.out)
    _check_resumable(args.out, collect_rows.COLUMNS)
    cfg = profile.CollectConfig(
        device=args.device,
        out=args.out,
        ops=_choices(args.ops, profile.OPS, "--ops"),
        dtypes=_choices(args.dtypes, profile.DTYPES, "--dtypes"),
        budget_s=args.budget_s,
        repeats=args.repeats,
    )
    if args.device == "cuda" and not profile.torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device here; use --device cpu")
    rep = profile.collect(cfg)
    pairs = sorted({" ".join(u.split(" ")[:2]) for u in rep.unsupported})
    if rep.measured == 0 and rep.skipped_existing == 0:  # and no file written (`collect`)
        if rep.stopped_by_budget:
            raise ConfigError(
                f"--budget-s {args.budget_s:g}: ended before the first kernel was measured "
                "(nothing written); give more seconds"
            )
        why = f"unsupported on {args.device}: {', '.join(pairs)}" if pairs else "out of memory"
        raise ConfigError(
            f"--ops/--dtypes: nothing could be measured ({why}; nothing written); ask for "
            "ops and dtypes this device runs"
        )
    print(f"measured {rep.measured} kernels, skipped {rep.skipped_existing} already in {args.out}")
    print(f"unsupported here (op dtype): {', '.join(pairs) or 'none'}")
    if rep.out_of_memory:  # whole shapes: "op dtype (dims)", without the allocator's message
        print(f"out of memory (skipped): {'; '.join(u.split(':')[0] for u in rep.out_of_memory)}")
    if rep.profiler_errors:  # timed rows kept, without kernel name and launch dims
        print(f"profiler failed on {len(rep.profiler_errors)} kernels: {rep.profiler_errors[0]}")
    stop = "budget reached" if rep.stopped_by_budget else "plan finished"
    print(f"{stop} after {rep.elapsed_s:.1f} s")
    return 0


def _tc_calibrate(args: argparse.Namespace) -> int:
    from forecast.tc_calibrate import calibrate, validation_rows
    from forecast.tensor_core import PARAMS_FILE

    data = args.data or TC_DATA_DIR
    holdout = None if args.holdout == "none" else args.holdout
    out = PARAMS_FILE if args.write else None
    params = calibrate(data, holdout=holdout, out=out, measured=args.measured)
    rows = validation_rows(params, data, args.measured)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"calibrated on {params.calibrated_on}; held out: {holdout or 'none'}")
    print(f"{'gpu':16} {'case':28} {'dtype':5} {'split':11} {'meas':>7} {'pred':>7} {'err%':>6}")
    for r in rows:
        print(
            f"{r['gpu']!s:16} {r['case']!s:28} {r['dtype']!s:5} {r['split']!s:11} "
            f"{r['measured_tflops']:7.1f} {r['predicted_tflops']:7.1f} {r['error_pct']:6.1f}"
        )
    if args.measured:  # many rows: a summary per GPU, source and split
        groups: dict[tuple[str, ...], list[float]] = {}
        for r in rows:
            key = (str(r["gpu"]), str(r["source"]), str(r["split"]))
            groups.setdefault(key, []).append(abs(float(str(r["error_pct"]))))
        for (gpu, source, split), errs in sorted(groups.items()):
            mean = statistics.mean(errs)
            print(f"{gpu} {source} {split}: {len(errs)} cases, mean |err| {mean:.1f}%")
    return 0
