"""``tilesim kernels ...``: the command group, and the tile-MLP's train, validate, plot, table.

``kernels predict`` and ``kernels eval`` are `simulator.kernel_predict_commands`'s; ``kernels
collect`` and ``tc-calibrate`` are `simulator.collect_commands`'s. Handlers parse, load, call
one library function of `forecast` and print.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from forecast.dataset import default_data_dir
from forecast.evaluate import neusight_test_rows, unseen_errors, validate
from forecast.files import write_text_atomic
from forecast.predict import WEIGHTS_DIR
from forecast.report import TABLE_CAPTION, ReportError, update_readme, validation_markdown
from simulator.collect_commands import add_collect_commands
from simulator.errors import ConfigError, check_writable_above, path_arg, refuse_special_file
from simulator.kernel_predict_commands import (
    add_eval_command,
    add_predict_command,
    latency_model_arg,
)

VALIDATION_FILE = WEIGHTS_DIR / "validation.json"
DATA_HELP = f"NeuSight data folder (default: {default_data_dir()})"


def add_kernel_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``kernels predict|collect|tc-calibrate|eval|train|validate|plot|table``."""
    p = sub.add_parser(
        "kernels",
        help="single-GPU kernel latency: predict, eval, train, validate, table, plot, collect, "
        "tc-calibrate",
    )
    ks = p.add_subparsers(dest="kernels_cmd", required=True, metavar="COMMAND")
    add_predict_command(ks)
    add_collect_commands(ks)
    add_eval_command(ks)
    _add_train(ks)
    _add_validate(ks)
    _add_plot(ks)
    _add_table(ks)


def _add_train(ks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = ks.add_parser("train", help="train the tile-MLP on the five NeuSight training GPUs")
    t.add_argument("--data", type=path_arg, default=None, help=DATA_HELP)
    t.add_argument(
        "--out",
        type=path_arg,
        default=WEIGHTS_DIR,
        help=f"weights folder to write (default: {WEIGHTS_DIR}, the shipped weights)",
    )
    t.set_defaults(handler=_train)


def _add_validate(ks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    v = ks.add_parser("validate", help="unseen-GPU, AMD and leave-one-GPU-out errors vs roofline")
    v.add_argument("--data", type=path_arg, default=None, help=DATA_HELP)
    v.add_argument(
        "--out",
        type=path_arg,
        default=VALIDATION_FILE,
        help=f"JSON report to write (default: {VALIDATION_FILE}, what `kernels table` reads)",
    )
    v.add_argument("--no-logo", action="store_true", help="skip leave-one-GPU-out (5 retrains)")
    v.set_defaults(handler=_validate)


def _add_plot(ks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pl = ks.add_parser("plot", help="figure: predicted vs measured on GPUs absent from training")
    pl.add_argument("--data", type=path_arg, default=None, help=DATA_HELP)
    pl.add_argument(
        "--out",
        type=path_arg,
        default=Path("kernels.png"),
        help="figure to write, PNG, PDF or SVG by its suffix (default: kernels.png)",
    )
    pl.set_defaults(handler=_plot)


def _add_table(ks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tb = ks.add_parser("table", help="print the validation table; --readme rewrites it in place")
    tb.add_argument(
        "--report",
        type=path_arg,
        default=VALIDATION_FILE,
        help=f"validation JSON of `kernels validate` (default: {VALIDATION_FILE})",
    )
    tb.add_argument("--readme", type=path_arg, default=None, help="README to update in place")
    tb.set_defaults(handler=_table)


def _check_out(path: Path, *, folder: bool) -> None:
    """Refuse before the minutes of training an ``--out`` the result cannot be written to (a
    file where the weights folder goes, a folder where the report goes, no writable folder)."""
    if folder and path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path}: a file is there; give a folder for the weights")
    if not folder and (path.is_dir() or not path.name):
        raise ConfigError(f"--out {path} is a folder; give a file name such as validation.json")
    if not folder:
        refuse_special_file(path, "--out")
    check_writable_above(path if folder else path.parent, f"--out {path}")


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
    models = {k: latency_model_arg(k) for k in ("tile-mlp", "roofline")}
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
    if report.get("unseen_model"):
        print(f"unseen GPUs: {report['unseen_model']}")
    print(f"wrote {args.out}")
    return 0
