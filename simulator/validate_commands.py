"""``tilesim validate e2e``: whole-model error against NeuSight's labels, per GPU, per op
family and for the kernels measured twice (``validate distributed`` is registered here from
`simulator.simulate_commands`).

The handler checks its outputs first, calls `e2e_runs` and `e2e_tables`, and prints.
"""

from __future__ import annotations

import argparse

from forecast.report import check_readme, update_readme_tables
from simulator.e2e_tables import E2E_MARKERS, e2e_runs, e2e_tables
from simulator.errors import ConfigError, path_arg
from simulator.models import DEFAULT_DATA_DIR
from simulator.simulate_commands import add_validate_distributed


def add_validate_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``validate e2e|distributed``."""
    v = sub.add_parser("validate", help="validation against measurements")
    vs = v.add_subparsers(dest="validate_cmd", required=True, metavar="COMMAND")
    e = vs.add_parser(
        "e2e",
        help="whole-model error per GPU, per op family against the per-op traces, the "
        "kernels measured twice, torch.compile runs and the training runs' forward / backward "
        "split (NeuSight labels)",
    )
    e.add_argument(
        "--data",
        type=path_arg,
        default=DEFAULT_DATA_DIR,
        help=f"NeuSight data folder (default: {DEFAULT_DATA_DIR})",
    )
    e.add_argument("--markdown", action="store_true", help="print the README tables only")
    e.add_argument(
        "--readme",
        type=path_arg,
        default=None,
        help="rewrite the README's five e2e tables (per GPU, per op family, kernels measured "
        "twice, torch.compile runs, training runs' forward / backward split), all or none",
    )
    e.add_argument(
        "--plot", type=path_arg, default=None, help="draw predicted vs measured (PNG, PDF, SVG ...)"
    )
    e.set_defaults(handler=_validate_e2e)
    add_validate_distributed(vs)


def _validate_e2e(args: argparse.Namespace) -> int:
    if args.plot is not None:  # the outputs first, as `kernels validate` checks --out
        from simulator.figures import figure_path

        figure_path(args.plot, "--plot")
    if not (args.data / "labels").is_dir():
        raise ConfigError(f"--data {args.data}: no labels folder; give the NeuSight data folder")
    if args.readme is not None:  # before the minutes of work, and all five tables or none
        check_readme(args.readme, E2E_MARKERS)
    runs, skipped = e2e_runs(args.data)
    compiled = e2e_runs(args.data, compiled=True)[0]
    tables = e2e_tables(args.data, runs, compiled)
    if args.readme is not None:
        update_readme_tables(args.readme, [(t.markdown, t.begin, t.end) for t in tables])
    for i, t in enumerate(tables):  # Markdown needs a blank line between two tables
        print(("\n" if i else "") + t.markdown if args.markdown else f"{t.title}\n{t.markdown}\n")
    if not args.markdown:
        for folder, why in skipped.items():
            print(f"skipped {folder}: {why}")
    if args.plot is not None:
        from simulator.e2e_plots import plot_e2e  # matplotlib only when a figure is drawn

        print(f"wrote {plot_e2e(runs['tile-mlp'], args.plot, compiled['tile-mlp'])}")
    return 0
