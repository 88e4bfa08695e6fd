"""Rows -> rankings, the top-K table, the procurement summary and the Markdown report.

Only simulated, fitting rows are ranked (the screen only chooses what to simulate). Rankings:
``tokens`` (tokens/s, highest first), ``time`` (time to train the token budget) and ``cost``
(GPU-hours x the user's price). Nothing here simulates; everything reads rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from simulator.errors import ConfigError
from simulator.rows import Row

# ranking id -> (column, highest first)
RANKINGS: dict[str, tuple[str, bool]] = {
    "tokens": ("tokens_per_s", True),
    "time": ("time_to_train_s", False),
    "cost": ("cost_usd", False),
}
# ranking id -> what a reader is told the ranking is by
RANKING_NAMES = {"tokens": "tokens/s", "time": "time to train", "cost": "cost"}


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


def unranked_contexts(rows: Sequence[Row], by: str = "tokens") -> dict[str, tuple[str, str]]:
    """Each context of ``rows`` without a ranked layout -> (short, long) reason: none of its
    layouts fits (the long reason: the one needing the least memory), none that fits was
    simulated, its rows lack the ranking's column, or every layout failed. Such an option
    vanished from the report's table and the procurement figure."""
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
            need = "no price_per_gpu_hour" if by == "cost" else "no sweep.train_tokens"
            out[ctx] = (need, f"not ranked by {RANKING_NAMES[by]}: {need}")
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


def amount_text(v: float | None) -> str:
    """Days, dollars, MWh or a step's seconds: whole numbers from 100 up, else three
    significant digits (fixed decimals printed a fine-tuning job's 0.37 $ as "0", its 0.19 MWh
    as "0", 0.002 days as "0.0"; a step's ".3g" printed 19.0 s as "19" beside "19.1")."""
    return "-" if v is None else format(v, ",.0f" if abs(v) >= 100 else "#.3g")


def layout_label(r: Row) -> str:
    """A short text of a row's layout: tp (cp when over 1), pp, dp, micro-batch, schedule,
    recompute, ZeRO, then sp and dist-opt when on; every sweep key that can tell two rows of
    one context apart shows (a cp 2 row read as tp2 pp4 dp128 on 2,048 GPUs)."""
    sched = r["schedule"] + (f"/v{r['virtual_stages']}" if r["virtual_stages"] > 1 else "")
    cp = f" cp{r['cp']}" if (r.get("cp") or 1) > 1 else ""
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


def top_table(rows: Sequence[Row], *, k: int = 10, by: str = "tokens") -> str:
    """The K best layouts as a Markdown table (also what the terminal prints)."""
    header = ["#", "context", "layout", "tokens/s", "MFU", "step s", "bubble", "GiB/GPU"]
    header += ["days", "cost $"]
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
                amount_text(r["iteration_s"]),
                _fmt(r["bubble_fraction"], ".1%"),
                _fmt(r["memory_gib_per_gpu"], ".1f"),
                amount_text(days),
                amount_text(r["cost_usd"]),
            ]
        )
    return _table(header, lines)


def procurement_table(rows: Sequence[Row], *, by: str = "tokens") -> str:
    """For each option and size: best layout, throughput, time to train, cost, energy; an
    option and size without one says why (`unranked_contexts`)."""
    header = ["option", "GPUs", "best layout", "tokens/s", "MFU", "days", "cost $", "MWh"]
    lines = []
    where = {r["context"]: r for r in rows}
    for ctx, r, (_, why) in procurement_entries(rows, by):
        if r is None:
            lines.append([where[ctx]["option"], str(where[ctx]["num_gpus"]), why, *["-"] * 5])
            continue
        days = None if r["time_to_train_s"] is None else r["time_to_train_s"] / 86400
        lines.append(
            [
                r["option"],
                str(r["num_gpus"]),
                layout_label(r),
                _fmt(r["tokens_per_s"], ",.0f"),
                _fmt(r["mfu"], ".1%"),
                amount_text(days),
                amount_text(r["cost_usd"]),
                amount_text(r["energy_mwh"]),
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


def screen_error(rows: Sequence[Row]) -> tuple[float, float] | None:
    """Median and max |screen / simulate - 1| of tokens/s over the simulated rows."""
    errs = sorted(
        abs(r["screen_tokens_per_s"] / r["tokens_per_s"] - 1)
        for r in rows
        if r["tier"] == "simulate" and r["tokens_per_s"] and r["screen_tokens_per_s"]
    )
    return (errs[len(errs) // 2], errs[-1]) if errs else None


def _reasons(rows: Sequence[Row]) -> str:
    c = Counter(
        (r["reason"] or "").split(" needs ")[0] for r in rows if r["status"] == "infeasible"
    )
    return ", ".join(f"{n} x {why}" for why, n in c.most_common(5)) or "none"


def _basis(rows: Sequence[Row]) -> list[str]:
    """What days, $ and MWh are for (the tables did not say): the token budget, the forms."""
    tokens = next((r["train_tokens"] for r in rows if r.get("train_tokens")), None)
    if tokens is None:
        return []
    return [
        f"* Days, cost and energy are for the token budget, {tokens:g} tokens "
        "(`sweep.train_tokens`), at each layout's simulated tokens/s: cost = GPUs x hours x "
        "price_per_gpu_hour; energy = GPUs x power_w_per_gpu x time, with the scenario's "
        "power per GPU as given (no facility overhead, PUE, is added)."
    ]


# said only when the scenario gives a price or a power (every report said it)
PRICE_NOTE = (
    "* Prices and power are the scenario's inputs (see the scenario file), not catalog facts."
)

# What each column of the report's tables is (the report printed them unexplained), and the
# top-layouts figure's parts; the definitions are those of `simulator.results`
COLUMNS = """\
* `context`: the cluster option and its GPU count, `option@GPUs`.
* `layout`, `best layout`: tensor (`tp`), context (`cp`, shown when over 1), pipeline (`pp`) and
  data (`dp`) parallel degrees, micro-batch size (`mbs`), pipeline schedule (`/vN`: N virtual
  stages per GPU), activation recomputation (none, selective, full), ZeRO stage (`z`), then
  `sp` (sequence parallelism) and `dist-opt` (distributed optimizer) when on.
* `tokens/s`: the whole cluster's training throughput, global batch x sequence length / step
  time.
* `MFU`: model FLOPs per step / (GPUs x step time x the GPU's dense peak FLOP/s in the training
  dtype). Model FLOPs are 3 forward passes (the backward counted as two), a forward pass per
  token being 2 x the layer weights (QKV, projection, FFN) + 4 x sequence length x attention
  width per layer (causal mask not discounted) + 2 x hidden size x vocabulary for the head
  (Narayanan et al. 2021, eq. 3); recomputation is not counted (it is in the rows' `hfu`).
* `step s`: the simulated time of one training step (forward, backward and optimizer), seconds.
* `bubble`: the mean over GPUs of the share of the forward-backward span a GPU's compute stream
  is idle: pipeline fill and drain, and waits on communication not hidden under compute (the
  gradient reduction left after the last backward, and the optimizer, are not in it).
* `GiB/GPU`: peak memory of the fullest GPU (weights, gradients, optimizer state, activations
  in flight, reserved), in GiB (2^30 bytes); a layout over the GPU's memory does not fit.
* `option`, `GPUs`: the cluster option (`[[sweep.options]]` by id, else the cluster's GPU)
  and its size.
* `days`, `cost $`, `MWh`: time, cost and energy to train the token budget `sweep.train_tokens`
  at the layout's tokens/s (`-` without the budget, a price or a power; see Notes).
* Top-layouts figure: each step's critical path split into compute, exposed communication by
  kind (time on the critical path spent in tp, cp, ep, pp or dp communication that compute did
  not hide) and the optimizer; the parts add up to the step."""


def markdown_report(
    rows: Sequence[Row],
    *,
    title: str,
    pruned: Sequence[tuple[str, int, str]],
    k: int = 10,
    by: str = "tokens",
) -> str:
    """The sweep's report: counts, top K, best per cluster option, screen accuracy, errors;
    ``pruned``: (rule, layouts, the first one's reason) of the layouts pruned before screening
    (`space.Space.pruned_by`)."""
    n = counts(rows)
    n_pruned = sum(c for _, c, _ in pruned)
    by_rule = [f"* {c} by `{rule}`: {why}" for rule, c, why in pruned]
    err = screen_error(rows)
    shown = min(k, len(rank(rows, by)))
    parts = [
        f"# Sweep: {title}",
        f"{n['layouts'] + n_pruned} layouts enumerated; {n_pruned} pruned as invalid or duplicate; "
        f"{n['layouts']} screened in closed form; {n['infeasible']} do not fit in memory; "
        f"{n['simulated']} simulated with the execution graph; {n['errors']} errors. "
        f"Ranked by {RANKING_NAMES[by]} (simulated layouts only).",
        *(
            [
                "Pruned before screening, by rule (for a key's rule, the first pruned "
                "layout's reason):"
            ]
            if by_rule
            else []
        ),
        *(["\n".join(by_rule)] if by_rule else []),
        f"## Top {shown}",
        top_table(rows, k=k, by=by),
        f"## Best layout per cluster option (best first by {RANKING_NAMES[by]})",
        procurement_table(rows, by=by),
        "## Columns",
        COLUMNS,
        "## Notes",
        f"* Screen vs simulation, tokens/s: median |error| {err[0]:.1%}, max {err[1]:.1%}."
        if err
        else "* No simulated rows to check the screen against.",
        f"* Infeasible (stage that does not fit, by count): {_reasons(rows)}.",
        *_basis(rows),
        *(
            [PRICE_NOTE]
            if any(r.get("price_per_gpu_hour") or r.get("power_w_per_gpu") for r in rows)
            else []
        ),
    ]
    failed = [r for r in rows if r["status"] == "error"]
    if failed:
        parts += ["## Errors", *[f"* `{r['key']}`: {r['reason']}" for r in failed[:20]]]
    parts += [
        "## Figures",
        "![top layouts](top_layouts.png)",
        "![throughput vs memory](pareto.png)",
        "![scaling](scaling.png)",
        "![procurement](procurement.png)",
    ]
    return "\n\n".join(parts) + "\n"
