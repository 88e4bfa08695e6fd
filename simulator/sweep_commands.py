"""``tilesim sweep``: the tiered layout search of a scenario (it also registers ``tilesim plot``,
which redraws the figures, from `simulator.plot_commands`).

The sweep: enumerate the ``[sweep]`` space, screen every layout in closed form, simulate the
best candidates with the execution graph, then write rows, the resolved scenario, the report
and the figures to the output directory. Rows are logged as they arrive, so rerunning an
interrupted command resumes it (Ctrl-C at any point prints one line and exits 130). A rerun into
the same folder resumes only rows of the same code, scenario and input files (the bytes of every
GPU, server, network and model file the scenario names); rows of other ``--candidates`` or
``--per-context`` settings stay in the log but only this run's candidates are reported, so the
same command gives the same rows whatever the folder held. Exit codes: 0 ok, 1 no feasible
layout or failed layouts, 2 bad input, 130 interrupted. The output folder (default path, the
fingerprint a rerun must match, the checks before any work) is `simulator.sweep_folder`'s.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from forecast.files import write_text_atomic
from simulator.errors import ConfigError, InfeasibleConfig, add_set_option, at_least
from simulator.plot_commands import add_plot_command
from simulator.report import RANKINGS, TOP_K, markdown_report, mfu_over_100_note, top_table
from simulator.rows import ProgressLog, Row, final_rows, write_rows
from simulator.scenario import Scenario, check_tokens, load_scenario
from simulator.space import Point, Space, enumerate_space, find_scenario, point_keys
from simulator.sweep import Executor, RayOptions, check_address, ray_session, run_sweep
from simulator.sweep_chunks import chunk_size
from simulator.sweep_eval import (
    PER_CONTEXT,
    TOP_CANDIDATES,
    Shared,
    Tier,
    build_shared,
    candidate_points,
)
from simulator.sweep_folder import (
    FIGURE_FILES,
    check_out,
    default_out_dir,
    fingerprint,
    remove_results,
    write_resolved,
)

LOCAL_CPUS = os.cpu_count() or 2  # a local Ray's CPUs unless --workers says otherwise


def add_sweep_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``sweep`` and ``plot``."""
    p = sub.add_parser("sweep", help="search the parallel layouts of a scenario (Ray or serial)")
    p.add_argument("scenario", help="shipped id (scenarios/*.toml stem, _ as -) or TOML path")
    p.add_argument("--out", help="output dir (default results/<study>/<hash>/)")
    _add_executor_options(p)
    _add_ranking_options(p)
    add_set_option(p, "training.global_batch_size=2048 or sweep.tp=[4,8]")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_sweep)
    add_plot_command(sub)


def _add_executor_options(p: argparse.ArgumentParser) -> None:
    """``--address``, ``--workers``, ``--serial``: where the layouts run."""
    p.add_argument(
        "--address", help="join a Ray cluster: HOST:PORT, auto or ray://HOST:PORT (default: local)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"local Ray CPUs (default: this machine's, {LOCAL_CPUS}); not with --address or "
        "--serial",
    )
    p.add_argument(
        "--serial", action="store_true", help="no Ray; identical rows; not with --address"
    )


def _add_ranking_options(p: argparse.ArgumentParser) -> None:
    """``--top``, ``--rank``, ``--candidates``, ``--per-context``: what is simulated and shown."""
    p.add_argument(
        "--top",
        type=int,
        default=TOP_K,
        help="layouts in the printed ranking, the report's table and the top-layouts figure "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--rank", default="tokens", choices=sorted(RANKINGS), help="ranking (default: %(default)s)"
    )
    p.add_argument(
        "--candidates",
        type=int,
        default=TOP_CANDIDATES,
        help="layouts the screen rates fastest (cheapest under --rank cost) simulated in full "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--per-context",
        type=int,
        default=PER_CONTEXT,
        help="also simulate the N fastest of each cluster size and option (default: %(default)s)",
    )


def _tier(
    args: argparse.Namespace, log: ProgressLog, tier: Tier, points: Sequence[Point], shared: Shared
) -> list[Row]:
    """Run one tier over the layouts not yet in the log; return the tier's rows of ``points``."""
    keys = point_keys(points, shared.contexts)
    todo = [p for p, k in zip(points, keys, strict=True) if not log.has(k, tier)]
    executor: Executor = "serial" if args.serial else "ray"
    chunk = chunk_size(tier, len(todo), args.workers)
    bar = tqdm(
        total=len(points),
        initial=len(points) - len(todo),
        desc=tier,
        unit="layout",
        disable=args.no_progress,
        file=sys.stderr,
    )

    def on_rows(rows: list[Row]) -> None:
        log.append(rows)
        bar.update(len(rows))

    opts = RayOptions(workers=args.workers, address=args.address)
    try:
        run_sweep(
            tier,
            todo,
            shared,
            executor=executor,
            chunk_size=chunk,
            on_rows=on_rows,
            ray_options=opts,
        )
    finally:  # end the bar's line before a Ctrl-C message (it was glued to the bar)
        bar.close()
    wanted = set(keys)  # the log may also hold rows of a rerun with other settings
    return [r for r in log.rows(tier) if r["key"] in wanted]


def _check_executor(args: argparse.Namespace) -> None:
    """``--workers`` sizes a local Ray only: with ``--serial`` or ``--address`` (the cluster's
    CPUs) it was ignored, as ``--address`` was with ``--serial``; refuse each pair."""
    if args.workers is not None:
        at_least("--workers", args.workers, 1)
    given = [f for f, v in (("--serial", args.serial), ("--address", args.address)) if v]
    if len(given) == 2 or (given and args.workers is not None):
        pair = given if len(given) == 2 else [given[0], "--workers"]
        why = "runs without Ray" if pair[0] == "--serial" else "runs on the cluster's CPUs"
        raise ConfigError(f"{pair[0]} {why}, so {pair[1]} would be ignored; drop one of them")
    if args.workers is None:
        args.workers = LOCAL_CPUS
    elif args.workers > 2 * LOCAL_CPUS:  # each worker is a process: many more than CPUs only
        print(  # add memory, not speed (a warning: the user may know the machine better)
            f"tilesim: warning: --workers {args.workers} on {LOCAL_CPUS} CPUs: each worker is a "
            f"process with its own memory, and more than the CPUs adds no speed",
            file=sys.stderr,
        )


def _check_args(args: argparse.Namespace) -> None:
    _check_executor(args)
    at_least("--top", args.top, 1)
    at_least("--candidates", args.candidates, 0)
    at_least("--per-context", args.per_context, 0)
    if args.candidates == 0 and args.per_context == 0:
        raise ConfigError(
            "--candidates 0 --per-context 0: no layout would be simulated and ranked; "
            "give --candidates 1 or more"
        )
    if not args.scenario.strip():
        raise ConfigError("sweep '': an empty path; give a scenario TOML or a shipped id")
    if args.out is not None and not args.out.strip():
        raise ConfigError("--out '': an empty path; give a folder, e.g. --out results/mine")
    if args.address is not None:
        check_address(args.address)


def _sweep(args: argparse.Namespace) -> int:
    out: Path | None = None
    try:
        _check_args(args)
        scenario = load_scenario(find_scenario(args.scenario), overrides=tuple(args.overrides))
        space = enumerate_space(scenario)
        if not space.points:  # every layout broke a rule: the lists are bad input (exit 2)
            raise ConfigError(
                f"no valid layout in the sweep ({space.pruned} pruned: {space.pruned_text()}); "
                "widen the [sweep] lists"
            )
        _check_ranking(args.rank, space)
        # tokens per micro-batch depend on its size and cp alone: one layout of each pair
        first: dict[tuple[int, int], Point] = {}
        for p in space.points:
            first.setdefault((p.micro_batch_size, p.cp), p)
        for point in first.values():  # in the points' order: the same first failure
            check_tokens(scenario.model.seq_len, point.run(scenario.run))
        target = Path(args.out) if args.out is not None else default_out_dir(scenario)
        check_out(target)
        shared = build_shared(space, scenario.run)
        # rows are resumed only for the same code, scenario and input files
        resume_key = fingerprint(scenario, space)
        out = target
        log, chosen = _run(args, space, shared, out, resume_key, scenario)
        return _finish(args, scenario, space, log, chosen, out)
    except KeyboardInterrupt:
        if out is None:
            print("tilesim: interrupted before the sweep started; nothing written", file=sys.stderr)
        else:
            msg = f"tilesim: interrupted; rerun the same command to resume ({out})"
            print(msg, file=sys.stderr)
        return 130


def _run(
    args: argparse.Namespace,
    space: Space,
    shared: Shared,
    out: Path,
    resume_key: str,
    scenario: Scenario,
) -> tuple[ProgressLog, list[Point]]:
    """Screen every layout and simulate the candidates, logging rows as they arrive."""
    executor: Executor = "serial" if args.serial else "ray"
    # Ray first: a cluster that cannot be joined leaves nothing written.
    with ray_session(executor, RayOptions(workers=args.workers, address=args.address)):
        try:
            log = ProgressLog(out, resume_key)
        except OSError as e:  # what `check_out` cannot foresee (root, /proc, a full disk)
            raise ConfigError(f"--out {out}: {e.strerror}; give another path") from None
        if log.stale:
            stale = (
                f"tilesim: {out} holds rows of another scenario, other input files or other "
                "tilesim code (or an unreadable progress.meta.json); starting afresh"
            )
            print(stale, file=sys.stderr)
        if log.stale or not log.done:  # no rows, report or figure but this sweep's
            remove_results(out)
        write_resolved(scenario, space, out, args.rank, args.top)
        screened = _tier(args, log, "screen", space.points, shared)
        top, per_context = args.candidates, args.per_context
        chosen = candidate_points(
            space.points, screened, shared, top=top, per_context=per_context, by=args.rank
        )
        _tier(args, log, "simulate", chosen, shared)
    log.settle()  # one order whatever order the rows arrived in
    return log, chosen


def _check_ranking(by: str, space: Space) -> None:
    """Refuse before any work a ranking the scenario cannot give (time and cost need the
    token budget; cost needs every option's price), instead of after the whole sweep."""
    if by in ("time", "cost") and space.train_tokens is None:
        raise ConfigError(f"--rank {by}: the scenario needs sweep.train_tokens = [N]")
    unpriced = sorted({c.option for c in space.contexts if c.price_per_gpu_hour is None})
    if by == "cost" and unpriced:
        raise ConfigError(
            f"--rank cost: the scenario needs price_per_gpu_hour for {', '.join(unpriced)}"
        )


def _finish(
    args: argparse.Namespace,
    scenario: Scenario,
    space: Space,
    log: ProgressLog,
    chosen: Sequence[Point],
    out: Path,
) -> int:
    screened, simulated = (point_keys(ps, space.contexts) for ps in (space.points, chosen))
    rows = final_rows(log, screened=screened, simulated=simulated)
    written = write_rows(rows, out)
    report = markdown_report(
        rows, title=scenario.study.name, pruned=space.pruned_by, k=args.top, by=args.rank
    )
    write_text_atomic(out / "report.md", report)
    from simulator.plots import plot_all  # matplotlib only when figures are drawn

    figures = plot_all(rows, out, by=args.rank, study=scenario.study.name, top=args.top)
    if not figures:  # nothing ranked: no figure, and none of an earlier sweep's left linked
        remove_results(out, FIGURE_FILES)
    print(top_table(rows, k=args.top, by=args.rank))
    note = mfu_over_100_note(rows, k=args.top, by=args.rank)
    if note:
        print(f"\n{note}")
    print(f"\nwrote {', '.join(str(p) for p in [*written, out / 'report.md', *figures])}")
    failed = [r["key"] for r in rows if r["status"] == "error"]
    if failed:
        print(f"tilesim: {len(failed)} layouts failed: {', '.join(failed[:10])}", file=sys.stderr)
        return 1
    if not any(r["status"] == "ok" for r in rows):
        raise InfeasibleConfig("no layout fits in memory")
    return 0
