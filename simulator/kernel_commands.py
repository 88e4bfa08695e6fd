"""``tilesim kernels ...``: predict one kernel, score measurement files, train, validate.

Handlers parse, load, call one library function of `forecast` and print.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from forecast.dataset import DataError, default_data_dir, load_measurements
from forecast.evaluate import NO_ROWS, neusight_test_rows, score, unseen_errors, validate
from forecast.files import write_text_atomic
from forecast.gpus import GPUError, load_gpu
from forecast.kernels import FAMILY_OPS, GEMM_FAMILIES, Dtype, KernelSpec, OpFamily, resolve_op
from forecast.predict import LATENCY_MODELS, WEIGHTS_DIR, ModelError, load_latency_model
from forecast.report import (
    TABLE_CAPTION,
    ReportError,
    eval_lines,
    kernel_header,
    kernel_lines,
    update_readme,
    validation_markdown,
)
from forecast.tensor_core import TensorCoreError
from simulator.collect_commands import add_collect_commands, check_dims, gemm_kernel
from simulator.errors import ConfigError, cannot_write_in, path_arg

KERNEL_ERRORS: tuple[type[Exception], ...] = (DataError, ModelError, TensorCoreError, ReportError)
VALIDATION_FILE = WEIGHTS_DIR / "validation.json"
DATA_HELP = f"NeuSight data folder (default: {default_data_dir()})"
MODEL_HELP = (
    "auto (default: tile-mlp for fp32, the tensor-core model for tf32/fp16/bf16/fp8 matmuls "
    "and attention, a bandwidth model for their other kernels), tile-mlp (fp32 only), "
    "roofline or tensor-core"
)


def _op_help() -> str:
    """Every --op name, by family (the list the error for an unknown op prints)."""
    ops = {f: ", ".join(names) for f, names in FAMILY_OPS.items()}
    return (
        f"gemm; {ops[OpFamily.BMM]}; {ops[OpFamily.LINEAR]}; {ops[OpFamily.ATTENTION]}; "
        f"softmax; layernorm (ln); element-wise: {ops[OpFamily.ELEMENTWISE]}; "
        f"memory: {ops[OpFamily.MEMORY]}; a family name means its first op"
    )


def add_kernel_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``kernels predict|eval|train|validate``."""
    p = sub.add_parser(
        "kernels",
        help="single-GPU kernel latency: predict, eval, train, validate, table, plot, collect, "
        "tc-calibrate",
    )
    ks = p.add_subparsers(dest="kernels_cmd", required=True, metavar="COMMAND")

    q = ks.add_parser("predict", help="latency of one kernel on one GPU")
    q.add_argument("--gpu", required=True, help="catalog id, device name, .toml or NeuSight .json")
    q.add_argument("--op", required=True, help=_op_help())
    q.add_argument(
        "--dims",
        required=True,
        help="M,N,K for gemm (K the reduction); B,M,N,K for bmm/linear (N the reduction); "
        "BH,S_q,S_kv,D for attention (flash attention 2: attention, attention_bwd non-causal; "
        "attention_causal, attention_causal_bwd causal, the mask aligned bottom right); "
        "B,H (rows, row width) for element-wise, softmax, layernorm and memory ops; "
        "sizes in elements",
    )
    q.add_argument(
        "--dtype",
        default="fp32",
        help="fp32 (default), tf32, fp16, bf16 or fp8; the GPU must have a catalog peak for it "
        "(fp8: Ada, Hopper, Blackwell, MI300 only)",
    )
    q.add_argument("--model", default="auto", help=MODEL_HELP)
    q.add_argument(
        "--json", action="store_true", help="print one JSON object: latency_s, tflops (TFLOP/s)"
    )
    q.set_defaults(handler=_predict)
    add_collect_commands(ks)

    e = ks.add_parser("eval", help="score measurement CSVs (NeuSight schema), per family")
    e.add_argument("--csv", nargs="+", required=True, type=path_arg, help=".csv or .csv.gz files")
    e.add_argument(
        "--model",
        default="tile-mlp",
        help=f"one of {', '.join(LATENCY_MODELS)} (default: tile-mlp, as the README's table)",
    )
    e.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: per family n, mape_pct, median_ape_pct, p90_ape_pct; skipped",
    )
    e.set_defaults(handler=_eval)

    t = ks.add_parser("train", help="train the tile-MLP on the five NeuSight training GPUs")
    t.add_argument("--data", type=path_arg, default=None, help=DATA_HELP)
    t.add_argument(
        "--out",
        type=path_arg,
        default=WEIGHTS_DIR,
        help=f"weights folder to write (default: {WEIGHTS_DIR}, the shipped weights)",
    )
    t.set_defaults(handler=_train)

    v = ks.add_parser("validate", help="unseen-GPU and leave-one-GPU-out errors vs roofline")
    v.add_argument("--data", type=path_arg, default=None, help=DATA_HELP)
    v.add_argument(
        "--out",
        type=path_arg,
        default=VALIDATION_FILE,
        help=f"JSON report to write (default: {VALIDATION_FILE}, what `kernels table` reads)",
    )
    v.add_argument("--no-logo", action="store_true", help="skip leave-one-GPU-out (5 retrains)")
    v.set_defaults(handler=_validate)

    pl = ks.add_parser("plot", help="figure: predicted vs measured on GPUs absent from training")
    pl.add_argument("--data", type=path_arg, default=None, help=DATA_HELP)
    pl.add_argument(
        "--out",
        type=path_arg,
        default=Path("kernels.png"),
        help="figure to write, PNG, PDF or SVG by its suffix (default: kernels.png)",
    )
    pl.set_defaults(handler=_plot)

    tb = ks.add_parser("table", help="print the validation table; --readme rewrites it in place")
    tb.add_argument(
        "--report",
        type=path_arg,
        default=VALIDATION_FILE,
        help=f"validation JSON of `kernels validate` (default: {VALIDATION_FILE})",
    )
    tb.add_argument("--readme", type=path_arg, default=None, help="README to update in place")
    tb.set_defaults(handler=_table)


def _parse_dims(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--dims {text!r}: give comma-separated positive integers") from None
    return check_dims(dims, text)


# what --dims holds per op: (count, form); no op pads a missing size with 1
DIMS_FORM = {
    "gemm": (3, "M,N,K (K the reduction)"),
    "gemm-family": (4, "B,M,N,K (N the reduction; --op gemm takes M,N,K)"),
    "attention": (4, "BH,S_q,S_kv,D"),
    "vector": (2, "B,H"),
}


def _check_count(text: str, count: int, op: str, form: tuple[int, str]) -> None:
    """Refuse ``--dims`` of the wrong length for ``op``, naming the form it takes."""
    if count != form[0]:
        raise ConfigError(
            f"--dims {text!r}: --op {op} takes {form[0]} sizes {form[1]}, got {count}"
        )


def _kernel(args: argparse.Namespace) -> KernelSpec:
    if args.dtype not in {d.value for d in Dtype}:
        accepted = ", ".join(d.value for d in Dtype)
        raise ConfigError(f"--dtype {args.dtype!r}: use one of {accepted}")
    if args.op == "gemm":  # M,N,K with K the reduction -> bmm (1, M, K, N)
        _check_count(args.dims, len(args.dims.split(",")), "gemm", DIMS_FORM["gemm"])
        return gemm_kernel(args.dims, args.dtype)
    try:
        family, op = resolve_op(args.op)
    except ValueError as e:
        raise ConfigError(f"--op: {e}") from e
    dtype = Dtype(args.dtype)
    dims = _parse_dims(args.dims)
    form = (
        DIMS_FORM["gemm-family"]
        if family in GEMM_FAMILIES
        else DIMS_FORM["attention"]
        if family is OpFamily.ATTENTION
        else DIMS_FORM["vector"]
    )
    _check_count(args.dims, len(dims), args.op, form)
    try:
        return KernelSpec(family, dims, dtype, op)
    except ValueError as e:
        raise ConfigError(f"--dims/--op: {e}") from e


def _model(kind: str) -> Any:
    try:
        return load_latency_model(kind)
    except ValueError as e:
        if isinstance(e, KERNEL_ERRORS):
            raise
        raise ConfigError(f"--model: {e}") from e


def _predict(args: argparse.Namespace) -> int:
    kernel = _kernel(args)
    gpu = load_gpu(args.gpu)
    model = _model(args.model)
    try:
        latency_s = float(model.predict_s([kernel], gpu)[0])
    except (GPUError, TensorCoreError) as e:  # "dtype fp8: ..." names the flag the user set
        if str(e).startswith(("dtype ", "op ")):
            raise ConfigError(f"--{e}") from e
        raise
    if args.json:
        print(json.dumps({"latency_s": latency_s, "tflops": kernel.flops() / latency_s / 1e12}))
        return 0
    print(kernel_header(kernel, gpu, gemm_dims=args.dims if args.op == "gemm" else None))
    print("\n".join(f"  {line}" for line in kernel_lines(kernel, gpu, model, latency_s)))
    return 0


EVAL_FAMILIES = ("bmm", "linear", "elementwise", "softmax", "layernorm")


def _eval(args: argparse.Namespace) -> int:
    meas = load_measurements(args.csv)
    scored = score(_model(args.model), meas)
    # the five NeuSight families always (n 0 and nulls when the CSVs hold none of a family, so
    # a script reads the same keys whatever it passed), then any other family scored
    result = {f: scored.get(f, NO_ROWS) for f in EVAL_FAMILIES} | scored
    if all(s["n"] == 0 for fam, s in result.items() if fam != "skipped"):
        skipped = result["skipped"]
        first = (
            f"; {skipped[0]['file']} line {skipped[0]['line']}: {skipped[0]['reason']}"
            if skipped
            else ""
        )
        raise ConfigError(
            f"--csv: no row to score ({len(skipped)} skipped{first}); give measurements in "
            "the NeuSight schema"
        )
    if args.json:
        print(json.dumps(result))
        return 0
    print("\n".join(eval_lines(args.model, meas, result)))
    return 0


def _check_out(path: Path, *, folder: bool) -> None:
    """Refuse before the minutes of training an ``--out`` the result cannot be written to (a
    file where the weights folder goes, a folder where the report goes, no writable folder)."""
    if folder and path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path}: a file is there; give a folder for the weights")
    if not folder and (path.is_dir() or not path.name):
        raise ConfigError(f"--out {path} is a folder; give a file name such as validation.json")
    parent = path if folder else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {path}: {parent} is not a writable folder; give another path")
    why = cannot_write_in(parent)
    if why:
        raise ConfigError(f"--out {path}: cannot write in {parent} ({why}); give another path")


def _train(args: argparse.Namespace) -> int:
    from forecast.train import train_model

    _check_out(args.out, folder=True)
    data = args.data or default_data_dir()
    model = train_model(data)
    model.meta["heldout_unseen_gpus"] = unseen_errors(model, data)
    model.save(args.out)
    print(f"wrote weights to {args.out}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from forecast.dataset import TRAIN_DEVICES
    from simulator.figures import figure_path
    from simulator.kernel_plots import plot_predicted_vs_measured

    figure_path(args.out, "--out")
    meas = neusight_test_rows(args.data or default_data_dir())
    meas.frame = meas.frame[~meas.frame["Device"].isin(TRAIN_DEVICES)]
    models = {k: _model(k) for k in ("tile-mlp", "roofline")}
    print(f"wrote {plot_predicted_vs_measured(models, meas, args.out)}")
    return 0


def _table(args: argparse.Namespace) -> int:
    try:
        report = json.loads(args.report.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--report {args.report}: {e}; run `tilesim kernels validate`") from e
    try:
        table = validation_markdown(report)
    except ReportError as e:
        raise ConfigError(f"--report {args.report}: {e}; run `tilesim kernels validate`") from e
    if args.readme is None:
        print(TABLE_CAPTION)
        print(table)
        return 0
    update_readme(args.readme, table)
    print(f"updated {args.readme}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    _check_out(args.out, folder=False)
    report = validate(args.data or default_data_dir(), logo=not args.no_logo)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0
