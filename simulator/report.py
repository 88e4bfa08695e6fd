"""Rows -> rankings, the top-K table, the procurement summary and the Markdown report (its
prose, the column definitions and the Notes, in `report_notes`).

Only simulated, fitting rows are ranked (the screen only chooses what to simulate). Rankings:
``tokens`` (tokens/s, highest first), ``time`` (time to train the token budget) and ``cost``
(GPU-hours x the user's price). Nothing here simulates; everything reads rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from simulator.errors import ConfigError
from simulator.report_notes import COLUMNS, amount_text, notes
from simulator.results import OVER_100_REASON
from simulator.rows import Row

# ranking id -> (column, highest first)
RANKINGS: dict[str, tuple[str, bool]] = {
    "tokens": ("tokens_per_s", True),
    "time": ("time_to_train_s", False),
    "cost": ("cost_usd", False),
}
# ranking id -> what a reader is told the ranking is by
RANKING_NAMES = {"tokens": "tokens/s", "time": "time to train", "cost": "cost"}
TOP_K = 10  # layouts the top table, the report and the top-layouts figure show (`--top`)


def rank(rows: Sequence[Row], by: str = "tokens") -> list[Row]:
    """Simulated, fitting rows, best first (ties broken by key)."""
    if by not in RANKINGS:
        raise ConfigError(f"--rank {by!r}: use one of {sorted(RANKINGS)}")
    col, high = RANKINGS[by]
    ok = [r for r in rows if r["tier"] == "simulate" and r["status"] == "ok"]
    if ok and all(r.get(col) is None for r in ok):
        need = "sweep.train_tokens" + (" and price_per_gpu_hour" if by == "cost" else "")
        raise ConfigError(f"--rank {by}: the scenario needs {need}")
    ok = [r for r in ok if r.get(col) is not None]
    return sorted(ok, key=lambda r: (-r[col] if high else r[col], r["key"]))


def best_per_context(rows: Sequence[Row], by: str = "tokens") -> list[Row]:
    """The best simulated layout of each (option, world size), in context order."""
    best: dict[str, Row] = {}
    for r in rank(rows, by):
        best.setdefault(r["context"], r)
    return sorted(best.values(), key=lambda r: (r["option"], r["num_gpus"]))


def lacking_column(by: str) -> str:
    """What a context's simulated rows lack when they cannot be ranked ``by``."""
    return "no price_per_gpu_hour" if by == "cost" else "no sweep.train_tokens"


def unranked_contexts(rows: Sequence[Row], by: str = "tokens") -> dict[str, tuple[str, str]]:
    """Each context of ``rows`` without a ranked layout -> (short, long) reason: none of its
    layouts fits (the long reason: the one needing the least memory), its simulated layouts
    failed (it read "not simulated; raise --per-context" when its candidates had been
    simulated and had raised), none that fits was simulated, its rows lack the ranking's
    column, or every layout failed. Such an option vanished from the report's table and the
    procurement figure."""
    ranked = {r["context"] for r in rank(rows, by)}
    mine: dict[str, list[Row]] = {}
    for r in rows:
        if r["context"] not in ranked:
            mine.setdefault(r["context"], []).append(r)
    out: dict[str, tuple[str, str]] = {}
    for ctx, rs in mine.items():
        bad = sorted(
            (r for r in rs if r["status"] == "infeasible"),
            key=lambda r: (r["memory_gib_per_gpu"] is None, r["memory_gib_per_gpu"], r["key"]),
        )
        if any(r["tier"] == "simulate" and r["status"] == "ok" for r in rs):
            need = lacking_column(by)
            out[ctx] = (need, f"not ranked by {RANKING_NAMES[by]}: {need}")
        elif failed := sum(r["tier"] == "simulate" and r["status"] == "error" for r in rs):
            what = "layout" if failed == 1 else "layouts"
            out[ctx] = ("simulation failed", f"{failed} simulated {what} failed (see Errors)")
        elif any(r["status"] == "ok" for r in rs):
            out[ctx] = ("not simulated", "no fitting layout simulated; raise --per-context")
        elif bad:
            out[ctx] = ("no layout fits", f"no layout fits (least memory: {bad[0]['reason']})")
        else:
            out[ctx] = ("every layout failed", f"every layout failed ({len(rs)} errors)")
    return out


def procurement_entries(
    rows: Sequence[Row], by: str = "tokens"
) -> list[tuple[str, Row | None, tuple[str, str]]]:
    """(context, its best row or None, why none) of every context: best first by the
    ranking (ordered by option name, the table and the figure titled "ranked by cost" listed
    a dearer option above a cheaper one), then the unranked ones by option and size."""
    col, high = RANKINGS[by]
    best = {r["context"]: r for r in best_per_context(rows, by)}
    missing = unranked_contexts(rows, by)
    sizes = {r["context"]: (r["option"], r["num_gpus"]) for r in rows}
    ranked = sorted(best, key=lambda c: (-best[c][col] if high else best[c][col], *sizes[c], c))
    order = ranked + sorted(missing, key=lambda c: (*sizes[c], c))
    return [(c, best.get(c), missing.get(c, ("", ""))) for c in order]


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def hardware_text(rows: Sequence[Row]) -> str:
    """The hardware of a sweep's rows, for the report and the figures' titles (neither named
    it): one GPU as "H100 SXM5 80GB (dgx-h100 servers, ib-ndr)", several options by their
    servers; "" when the rows do not say."""
    kinds = sorted({(r["gpu"], r["server"], r["network"]) for r in rows if r.get("gpu")})
    if len(kinds) == 1:
        gpu, server, network = kinds[0]
        return f"{gpu} ({server} servers, {network})"
    servers = ", ".join(sorted({str(s) for _, s, _ in kinds}))
    networks = ", ".join(sorted({str(n) for *_, n in kinds}))
    return f"{servers} servers ({networks})" if kinds else ""


def layout_label(r: Row) -> str:
    """A short text of a row's layout: tp (cp when over 1), pp, dp, micro-batch, schedule,
    recompute, ZeRO, then sp and dist-opt when on; every sweep key that can tell two rows of
    one context apart shows (a cp 2 row read as tp2 pp4 dp128 on 2,048 GPUs)."""
    sched = r["schedule"] + (f"/v{r['virtual_stages']}" if r["virtual_stages"] > 1 else "")
    cp = f" cp{r['cp']}" if (r.get("cp") or 1) > 1 else ""
    cp += f" {r['cp_comm_type']}" if cp and r.get("cp_comm_type", "p2p") != "p2p" else ""
    extra = (" sp" if r["sequence_parallel"] else "") + (
        " dist-opt" if r.get("distributed_optimizer") else ""
    )
    return (
        f"tp{r['tp']}{cp} pp{r['pp']} dp{r['dp']} mbs{r['micro_batch_size']} {sched} "
        f"{r['recompute']} z{r['zero_stage']}{extra}"
    )


def _table(header: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def top_table(rows: Sequence[Row], *, k: int = TOP_K, by: str = "tokens") -> str:
    """The K best layouts as a Markdown table (also what the terminal prints)."""
    header = ["#", "context", "layout", "tokens/s", "MFU", "causal MFU", "step s", "bubble"]
    header += ["GiB/GPU", "days", "cost $"]
    lines = []
    for i, r in enumerate(rank(rows, by)[:k], 1):
        days = None if r["time_to_train_s"] is None else r["time_to_train_s"] / 86400
        lines.append(
            [
                str(i),
                r["context"],
                layout_label(r),
                _fmt(r["tokens_per_s"], ",.0f"),
                _fmt(r["mfu"], ".1%"),
                _fmt(r.get("mfu_causal"), ".1%"),  # null in rows an older tilesim wrote
                amount_text(r["iteration_s"]),
                _fmt(r["bubble_fraction"], ".1%"),
                _fmt(r["memory_gib_per_gpu"], ".1f"),
                amount_text(days),
                amount_text(r["cost_usd"]),
            ]
        )
    return _table(header, lines)


def mfu_over_100_note(rows: Sequence[Row], *, k: int = TOP_K, by: str = "tokens") -> str:
    """A line under `top_table` when one of its MFUs passes 100% (long causal sequences), else
    "": the terminal printed "MFU 163.7%" with no word on why (report.md explains its
    columns)."""
    if not any((r["mfu"] or 0.0) > 1.0 for r in rank(rows, by)[:k]):
        return ""
    return f"MFU over 100%: {OVER_100_REASON}"


def procurement_table(rows: Sequence[Row], *, by: str = "tokens") -> str:
    """For each option and size: best layout, throughput, time to train, cost, energy; an
    option and size without one says why (`unranked_contexts`)."""
    header = ["option", "GPUs", "best layout", "tokens/s", "MFU", "causal MFU", "days", "cost $"]
    header += ["MWh"]
    failing = any(r.get("goodput") is not None for r in rows)  # a [reliability] table
    header += ["goodput"] if failing else []
    lines = []
    where = {r["context"]: r for r in rows}
    for ctx, r, (_, why) in procurement_entries(rows, by):
        if r is None:
            dashes = ["-"] * (len(header) - 3)
            lines.append([where[ctx]["option"], str(where[ctx]["num_gpus"]), why, *dashes])
            continue
        days = None if r["time_to_train_s"] is None else r["time_to_train_s"] / 86400
        lines.append(
            [
                r["option"],
                str(r["num_gpus"]),
                layout_label(r),
                _fmt(r["tokens_per_s"], ",.0f"),
                _fmt(r["mfu"], ".1%"),
                _fmt(r.get("mfu_causal"), ".1%"),
                amount_text(days),
                amount_text(r["cost_usd"]),
                amount_text(r["energy_mwh"]),
                *([_fmt(r.get("goodput"), ".1%")] if failing else []),
            ]
        )
    return _table(header, lines)


def counts(rows: Sequence[Row]) -> dict[str, int]:
    """Layouts by outcome: screened, simulated, infeasible, errors."""
    c = Counter(r["status"] for r in rows)
    return {
        "layouts": len(rows),
        "fit": c["ok"],
        "infeasible": c["infeasible"],
        "errors": c["error"],
        "simulated": sum(r["tier"] == "simulate" for r in rows),
    }


def markdown_report(
    rows: Sequence[Row],
    *,
    title: str,
    pruned: Sequence[tuple[str, int, str]],
    k: int = TOP_K,
    by: str = "tokens",
) -> str:
    """The sweep's report: counts, top K, best per cluster option, screen accuracy, errors;
    ``pruned``: (rule, layouts, the first one's reason) of the layouts pruned before screening
    (`space.Space.pruned_by`)."""
    parts = [
        f"# Sweep: {title}",
        *_summary(rows, pruned, by),
        f"## Top {min(k, len(rank(rows, by)))}",
        top_table(rows, k=k, by=by),
        f"## Best layout per cluster option (best first by {RANKING_NAMES[by]})",
        procurement_table(rows, by=by),
        "## Columns",
        COLUMNS,
        "## Notes",
        *notes(rows),
        *_errors(rows),
        *(FIGURES if rank(rows, by) else ()),  # `plots.plot_all` draws none then
    ]
    return "\n\n".join(parts) + "\n"


def _summary(rows: Sequence[Row], pruned: Sequence[tuple[str, int, str]], by: str) -> list[str]:
    """The report's opening: layouts by outcome, then those pruned before screening by rule
    (for a key's rule, the first pruned layout's reason)."""
    n = counts(rows)
    n_pruned = sum(c for _, c, _ in pruned)
    hardware = hardware_text(rows)
    lines = [f"Hardware: {hardware}."] if hardware else []
    lines += [
        f"{n['layouts'] + n_pruned} layouts enumerated; {n_pruned} pruned as invalid or duplicate; "
        f"{n['layouts']} screened in closed form; {n['infeasible']} do not fit in memory; "
        f"{n['simulated']} simulated with the execution graph; {n['errors']} errors. "
        f"Ranked by {RANKING_NAMES[by]} (simulated layouts only)."
    ]
    if pruned:
        lines += [
            "Pruned before screening, by rule (for a key's rule, the first pruned "
            "layout's reason):",
            "\n".join(f"* {c} by `{rule}`: {why}" for rule, c, why in pruned),
        ]
    return lines


def _errors(rows: Sequence[Row]) -> list[str]:
    """The Errors section: the first 20 layouts that failed (no section when none did)."""
    failed = [r for r in rows if r["status"] == "error"]
    if not failed:
        return []
    return ["## Errors", *[f"* `{r['key']}`: {r['reason']}" for r in failed[:20]]]


# the figures `plots.plot_all` writes beside the report
FIGURES = (
    "## Figures",
    "![top layouts](top_layouts.png)",
    "![throughput vs memory](pareto.png)",
    "![scaling](scaling.png)",
    "![procurement](procurement.png)",
)
