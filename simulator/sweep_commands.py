"""``tilesim sweep`` (tiered layout search of a scenario) and ``tilesim plot`` (redraw figures).

The sweep: enumerate the ``[sweep]`` space, screen every layout in closed form, simulate the
best candidates with the execution graph, then write rows, the resolved scenario, the report
and the figures to the output directory. Rows are logged as they arrive, so rerunning an
interrupted command resumes it. Exit codes: 0 ok, 1 no feasible layout or failed layouts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from simulator.errors import ConfigError, InfeasibleConfig, at_least
from simulator.report import RANKINGS, markdown_report, top_table
from simulator.rows import ProgressLog, Row, code_fingerprint, final_rows, load_rows, write_rows
from simulator.scenario import Scenario, load_scenario
from simulator.space import Point, Space, enumerate_space, find_scenario
from simulator.sweep import (
    PER_CONTEXT,
    TOP_CANDIDATES,
    Executor,
    RayOptions,
    Shared,
    Tier,
    build_shared,
    candidate_points,
    chunk_size,
    ray_session,
    run_sweep,
)


def add_sweep_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``sweep`` and ``plot``."""
    p = sub.add_parser("sweep", help="search the parallel layouts of a scenario (Ray or serial)")
    p.add_argument("scenario", help="shipped id (scenarios/*.toml stem, _ as -) or TOML path")
    p.add_argument("--out", type=Path, help="output dir (default results/<study>/<hash>/)")
    p.add_argument("--address", help="join a Ray cluster: auto or HOST:PORT (default: local)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="local Ray CPUs")
    p.add_argument("--serial", action="store_true", help="no Ray; identical rows")
    p.add_argument("--top", type=int, default=10, help="rows in the printed ranking")
    p.add_argument("--rank", default="tokens", choices=sorted(RANKINGS), help="ranking")
    p.add_argument(
        "--candidates", type=int, default=TOP_CANDIDATES, help="layouts simulated in full"
    )
    p.add_argument(
        "--per-context", type=int, default=PER_CONTEXT, help="also simulate N per cluster"
    )
    p.add_argument("--set", dest="overrides", action="append", default=[], help="TABLE.KEY=V")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_sweep)
    p = sub.add_parser("plot", help="redraw a sweep's figures from its rows alone")
    p.add_argument("dir", type=Path, help="sweep output directory (holding rows.jsonl)")
    p.add_argument("--rank", default="tokens", choices=sorted(RANKINGS), help="ranking")
    p.set_defaults(handler=_plot)


def _digest(scenario: Scenario) -> str:
    """A short hash of everything the scenario (with its --set overrides) asks for."""
    dump = scenario.model_dump(mode="json", exclude={"base_dir"})
    return hashlib.sha256(json.dumps(dump, sort_keys=True).encode()).hexdigest()[:10]


def _out_dir(scenario: Scenario) -> Path:
    return Path("results") / scenario.study.name / _digest(scenario)


def _write_resolved(scenario: Scenario, space: Space, out: Path) -> None:
    contexts = [
        {
            "id": c.id,
            "gpu": c.inputs.gpu.name,
            "server": c.server,
            "network": c.network,
            "num_gpus": c.inputs.num_gpus,
            "price_per_gpu_hour": c.price_per_gpu_hour,
            "power_w_per_gpu": c.power_w_per_gpu,
        }
        for c in space.contexts
    ]
    resolved = {
        "scenario": scenario.model_dump(mode="json"),
        "model": space.contexts[0].inputs.model.model_dump(mode="json"),
        "contexts": contexts,
        "layouts": len(space.points),
        "pruned": space.pruned,
    }
    (out / "scenario.resolved.json").write_text(json.dumps(resolved, indent=1) + "\n")


def _tier(
    args: argparse.Namespace, log: ProgressLog, tier: Tier, points: Sequence[Point], shared: Shared
) -> list[Row]:
    """Run one tier over the layouts not yet in the log; return all rows of the tier."""
    keys = [p.key(shared.contexts[p.context].id) for p in points]
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
    run_sweep(
        tier, todo, shared, executor=executor, chunk_size=chunk, on_rows=on_rows, ray_options=opts
    )
    bar.close()
    return log.rows(tier)


def _sweep(args: argparse.Namespace) -> int:
    at_least("--workers", args.workers, 1)
    at_least("--top", args.top, 1)
    at_least("--candidates", args.candidates, 0)
    at_least("--per-context", args.per_context, 0)
    if args.candidates == 0 and args.per_context == 0:
        raise ConfigError(
            "--candidates 0 --per-context 0: no layout would be simulated and ranked; "
            "give --candidates 1 or more"
        )
    scenario = load_scenario(find_scenario(args.scenario), overrides=tuple(args.overrides))
    space = enumerate_space(scenario)
    if not space.points:
        raise InfeasibleConfig(f"no valid layout in the sweep ({space.pruned} pruned)")
    _check_ranking(args.rank, space)
    out = args.out or _out_dir(scenario)
    _check_out(out)
    shared = build_shared(space, scenario.run)
    executor: Executor = "serial" if args.serial else "ray"
    try:
        # Ray first: a cluster that cannot be joined leaves nothing written.
        with ray_session(executor, RayOptions(workers=args.workers, address=args.address)):
            try:
                # rows are resumed only for the same code and the same scenario
                log = ProgressLog(out, f"{code_fingerprint()}-{_digest(scenario)}")
            except OSError as e:  # what `_check_out` cannot foresee (root, /proc, a full disk)
                raise ConfigError(f"--out {out}: {e.strerror}; give another path") from None
            if log.stale:
                stale = (
                    f"tilesim: {out} holds rows of another scenario or other tilesim code; "
                    "starting afresh"
                )
                print(stale, file=sys.stderr)
            _write_resolved(scenario, space, out)
            screened = _tier(args, log, "screen", space.points, shared)
            top, per_context = args.candidates, args.per_context
            chosen = candidate_points(
                space.points, screened, shared, top=top, per_context=per_context
            )
            _tier(args, log, "simulate", chosen, shared)
    except KeyboardInterrupt:
        print(f"tilesim: interrupted; rerun the same command to resume ({out})", file=sys.stderr)
        return 130
    return _finish(args, scenario, space, log, out)


def _check_out(out: Path) -> None:
    """Refuse up front an output folder that cannot be made (a file is there, or the nearest
    existing parent is not a writable folder), instead of a traceback mid-sweep."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: a file is there; give a folder path")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {parent} is not a writable folder; give another path")


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
    args: argparse.Namespace, scenario: Scenario, space: Space, log: ProgressLog, out: Path
) -> int:
    rows = final_rows(log)
    written = write_rows(rows, out)
    report = markdown_report(
        rows, title=scenario.study.name, pruned=space.pruned, k=args.top, by=args.rank
    )
    (out / "report.md").write_text(report)
    from simulator.plots import plot_all  # matplotlib only when figures are drawn

    figures = plot_all(rows, out, by=args.rank)
    print(top_table(rows, k=args.top, by=args.rank))
    print(f"\nwrote {', '.join(str(p) for p in [*written, out / 'report.md', *figures])}")
    failed = [r["key"] for r in rows if r["status"] == "error"]
    if failed:
        print(f"tilesim: {len(failed)} layouts failed: {', '.join(failed[:10])}", file=sys.stderr)
        return 1
    if not any(r["status"] == "ok" for r in rows):
        raise InfeasibleConfig("no layout fits in memory")
    return 0


def _plot(args: argparse.Namespace) -> int:
    rows = load_rows(args.dir)
    out = args.dir if args.dir.is_dir() else args.dir.parent
    from simulator.plots import plot_all

    for path in plot_all(rows, out, by=args.rank):
        print(path)
    return 0
