"""The whole-model validation tables that ``tilesim validate e2e`` prints and writes into the
README (between each table's markers; a test checks the README's copies are this output).

1. Per GPU: whole-model error of tile-mlp and roofline against the measured e2e times, and
   how far each run's own per-op trace, summed, is from its e2e time.
2. Per GPU, mode and op family: the forecast total against the per-op traces' total (kernels
   attributed to the framework op they serve, as a trace attributes them).
3. Per GPU and family: the same kernel measured twice, a label trace's call time over the kernel
   tables' time for the identical shape; where it sits far from 1, labels and kernel data were
   measured under different conditions and no kernel model meets both.
4. Per ``torch.compile``d run (``-fusion``): measured and forecast (framework ``hf-compile``)
   times, and the compiled-over-eager ratio of each beside its eager twin's.
5. Per training run: the label's own forward and backward times, their ratio measured and
   forecast, and each pass's error. A backward runs about twice its forward's FLOPs, and most
   runs measure 1.7-2.1x; where a label's ratio sits far below that, its forward timer holds
   work the forecast does not see (or that its backward timer lost).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from forecast.predict import load_latency_model
from simulator.e2e import FITTED, family_times_s, predict_graph
from simulator.e2e_validate import (
    PreparedRun,
    load_labels,
    predicted_e2e_ms,
    prepare,
    rel_errors,
    same_kernel_ratios,
)
from simulator.label_trace import HOST, TABLED
from simulator.opgraph import Phase


@dataclass(frozen=True, slots=True)
class Table:
    """One printed table and the README markers around its copy."""

    title: str
    begin: str
    end: str
    markdown: str


E2E_BEGIN, E2E_END = "<!-- e2e-validation:begin -->", "<!-- e2e-validation:end -->"
FAMILY_BEGIN, FAMILY_END = "<!-- e2e-families:begin -->", "<!-- e2e-families:end -->"
SAME_BEGIN, SAME_END = "<!-- e2e-same-kernel:begin -->", "<!-- e2e-same-kernel:end -->"
COMPILE_BEGIN, COMPILE_END = "<!-- e2e-compile:begin -->", "<!-- e2e-compile:end -->"
SPLIT_BEGIN, SPLIT_END = "<!-- e2e-split:begin -->", "<!-- e2e-split:end -->"
E2E_MARKERS = (
    (E2E_BEGIN, E2E_END),
    (FAMILY_BEGIN, FAMILY_END),
    (SAME_BEGIN, SAME_END),
    (COMPILE_BEGIN, COMPILE_END),
    (SPLIT_BEGIN, SPLIT_END),
)


def gpu_rows(runs: dict[str, list[PreparedRun]]) -> list[str]:
    ours, roof = runs["tile-mlp"], runs["roofline"]
    e_ours, e_roof = rel_errors(ours, FITTED), rel_errors(roof, FITTED)
    rows = [
        "| GPU | runs | ours mean | ours max | roofline mean | roofline max "
        "| measured op sum: runs, mean, max |",
        "|---|---|---|---|---|---|---|",
    ]
    for gpu in sorted({p.label.gpu_id for p in ours}):
        idx = [i for i, p in enumerate(ours) if p.label.gpu_id == gpu]
        a, b = np.abs(e_ours[idx]) * 100, np.abs(e_roof[idx]) * 100
        traced = [ours[i].label for i in idx if ours[i].label.trace_ms is not None]
        c = np.array([abs(lab.trace_ms / lab.e2e_ms - 1) * 100 for lab in traced])  # type: ignore[operator]
        op_sum = f"{len(c)}, {c.mean():.1f}%, {c.max():.1f}%" if len(c) else "-"
        rows.append(
            f"| {gpu} | {len(idx)} | {a.mean():.1f}% | {a.max():.1f}% | "
            f"{b.mean():.1f}% | {b.max():.1f}% | {op_sum} |"
        )
    return rows


FAMILY_COLUMNS = ("linear", "bmm", "elementwise", "softmax", "layernorm", "memory")


def family_rows(runs: dict[str, list[PreparedRun]]) -> list[str]:
    """Per GPU and op family: the forecast's total over the runs that have a per-op trace
    against the same runs' traced total, as ``ours% (roofline%)`` signed errors."""
    head = " | ".join(FAMILY_COLUMNS)
    rows = [f"| GPU | mode | runs | {head} | trace in no-kernel ops |", "|---" * 10 + "|"]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(runs["tile-mlp"]):
        if p.label.trace_family_ms is not None:
            groups.setdefault((p.label.gpu_id, p.label.run.mode), []).append(i)
    for (gpu, mode), idx in sorted(groups.items()):
        meas: dict[str, float] = defaultdict(float)
        pred: dict[str, dict[str, float]] = {k: defaultdict(float) for k in runs}
        for i in idx:
            for fam, ms in (runs["tile-mlp"][i].label.trace_family_ms or {}).items():
                meas[fam] += ms
            for kind, items in runs.items():
                p = items[i]
                for fam, t in family_times_s(p.graph, p.table, FITTED, by_op=True).items():
                    pred[kind][fam] += t * 1e3
        cells = []
        for fam in FAMILY_COLUMNS:
            if meas[fam] <= 0:
                cells.append("-")
                continue
            ours, roof = (pred[k][fam] / meas[fam] - 1 for k in ("tile-mlp", "roofline"))
            cells.append(f"{ours:+.0%} ({roof:+.0%})")
        host = meas[HOST] / sum(meas.values())
        rows.append(f"| {gpu} | {mode} | {len(idx)} | {' | '.join(cells)} | {host:.1%} |")
    return rows


def compiled_rows(compiled: Runs, eager: Runs) -> list[str]:
    """Per compiled run: measured ms, our forecast's and roofline's signed error, and the
    compiled / eager ratio measured and forecast (tile-mlp) against the eager twin run."""
    rows = [
        "| GPU | run | measured ms | ours ms | ours | roofline | compiled / eager: "
        "measured, ours |",
        "|---|---|---|---|---|---|---|",
    ]
    twins = {_key(p): p for p in eager["tile-mlp"]}
    ours, roof = compiled["tile-mlp"], compiled["roofline"]
    e_ours, e_roof = rel_errors(ours, FITTED), rel_errors(roof, FITTED)
    for i, p in enumerate(ours):
        lab, twin = p.label, twins.get(_key(p))
        run = f"{lab.model} {lab.run.mode} seq {lab.run.seq} batch {lab.run.batch}"
        pred = predicted_e2e_ms(p, FITTED)
        ratio = "-"
        if twin is not None:
            mine = pred / predicted_e2e_ms(twin, FITTED)
            ratio = f"{lab.e2e_ms / twin.label.e2e_ms:.2f}, {mine:.2f}"
        rows.append(
            f"| {lab.gpu_id} | {run} | {lab.e2e_ms:.1f} | {pred:.1f} | {e_ours[i]:+.1%} | "
            f"{e_roof[i]:+.1%} | {ratio} |"
        )
    return rows


def split_rows(runs: Runs) -> list[str]:
    """Per training run (tile-mlp): measured forward and backward ms; backward / forward as
    the label times it, as its per-op trace sums it (`label_trace.trace_pass_ms`) and as
    forecast; and the signed error of each pass and of their sum."""
    rows = [
        "| GPU | run | forward ms | backward ms | backward / forward: measured, trace, ours "
        "| forward | backward | e2e |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in sorted(runs["tile-mlp"], key=_key):
        lab = p.label
        if lab.run.mode != "train" or lab.fw_ms <= 0 or lab.bw_ms <= 0:
            continue
        tr = lab.trace_pass_ms
        traced = f"{tr['backward'] / tr['forward']:.2f}" if tr and tr["forward"] > 0 else "-"
        t = predict_graph(p.graph, p.table, FITTED)
        fw, bw = t[Phase.FORWARD] * 1e3, t[Phase.BACKWARD] * 1e3
        rows.append(
            f"| {lab.gpu_id} | {lab.model} seq {lab.run.seq} batch {lab.run.batch} | "
            f"{lab.fw_ms:.1f} | {lab.bw_ms:.1f} | {lab.bw_ms / lab.fw_ms:.2f}, {traced}, "
            f"{bw / fw:.2f} | "
            f"{fw / lab.fw_ms - 1:+.1%} | {bw / lab.bw_ms - 1:+.1%} | "
            f"{(fw + bw) / lab.e2e_ms - 1:+.1%} |"
        )
    return rows


def _key(p: PreparedRun) -> tuple[str, str, int, int, str]:
    lab = p.label
    return lab.gpu_id, lab.model, lab.run.seq, lab.run.batch, lab.run.mode


def same_kernel_rows(ratios: dict[str, dict[str, np.ndarray]]) -> list[str]:
    """Per GPU and family: rows matched, and the median (p10-p90) of trace / table time."""
    head = " | ".join(TABLED)
    rows = [f"| GPU | {head} |", "|---" * (1 + len(TABLED)) + "|"]
    for gpu, by in sorted(ratios.items()):
        cells = []
        for fam in TABLED:
            r = by.get(fam)
            if r is None:
                cells.append("-")
                continue
            p10, p50, p90 = np.percentile(r, [10, 50, 90])
            cells.append(
                f"{p50:.2f} ({p10:.2f}-{p90:.2f}), {len(r)} row{'' if len(r) == 1 else 's'}"
            )
        rows.append(f"| {gpu} | {' | '.join(cells)} |")
    return rows


Runs = dict[str, list[PreparedRun]]  # latency model -> every labelled run, same order


def e2e_runs(data_dir: Path, *, compiled: bool = False) -> tuple[Runs, dict[str, str]]:
    """Every labelled eager run (or with ``compiled`` every ``torch.compile``d one) prepared
    under tile-mlp and roofline, and the label folders skipped with their reason."""
    labels, skipped = load_labels(data_dir, compiled=compiled)
    runs = {k: prepare(labels, data_dir, load_latency_model(k)) for k in ("tile-mlp", "roofline")}
    return runs, skipped


def e2e_tables(data_dir: Path, runs: Runs, compiled: Runs) -> list[Table]:
    """The five tables of ``runs`` and ``compiled`` (from `e2e_runs` of the same
    ``data_dir``, eager and ``compiled=True``)."""
    return [
        Table(
            "Whole-model e2e error per GPU",
            E2E_BEGIN,
            E2E_END,
            "\n".join(gpu_rows(runs)),
        ),
        Table(
            "Per op family: forecast total / measured per-op trace total - 1, ours (roofline), "
            "runs with a per-op trace",
            FAMILY_BEGIN,
            FAMILY_END,
            "\n".join(family_rows(runs)),
        ),
        Table(
            "The same kernel measured twice: label trace call time / kernel-table time, "
            "identical shape and GPU, median (p10-p90)",
            SAME_BEGIN,
            SAME_END,
            "\n".join(same_kernel_rows(same_kernel_ratios(data_dir))),
        ),
        Table(
            "torch.compile runs (framework hf-compile): measured against forecast, and the "
            "compiled / eager ratio of each",
            COMPILE_BEGIN,
            COMPILE_END,
            "\n".join(compiled_rows(compiled, runs)),
        ),
        Table(
            "Training runs: the labels' own forward / backward split against ours (tile-mlp)",
            SPLIT_BEGIN,
            SPLIT_END,
            "\n".join(split_rows(runs)),
        ),
    ]
