"""Validation of the distributed simulator: NeuSight's 4-GPU A100 labels and published runs.

* ``labels/NVIDIA_A100-SXM4-40GB``: GPT-2 Large, global batch 4, seq 1024, fp32, Megatron-LM
  through HF Accelerate on 4 GPUs (``-dp4``, ``-tp4``, ``-pp4_1``: 4 stages, 1 micro-batch);
  the label is forward+backward of one step, compared with ``forward_backward_s``.
* ``published/dev_runs.json``: Megatron-LM and DeepSpeed runs on A100-SXM4-80GB DGX nodes.
  Narayanan rows publish TFLOP/s per GPU counting the recomputed forward (compared with
  ``hardware_tflops_per_gpu``, the same eq. 3 convention); Korthikanti rows publish the
  iteration time (the TFLOP/s error is then ``measured_s / predicted_s - 1``).

Settings the rows leave null (`STATED`): Narayanan's Table 1 micro-batch sizes, layers per
virtual pipeline stage and DDP implementation are those of the authors' reproduction script,
``examples/sc21/run_table_1.sh`` in NVIDIA/Megatron-LM (fp16, static loss scale, full
recompute, PyTorch DDP without model parallelism, Megatron's local DDP with it). Table 2 has
no script: its PTD-P rows keep their stated micro-batch 1 and Megatron's default schedule
(no interleaving flag, so plain 1F1B). PyTorch DDP all-reduces 25 MiB buckets during the last
micro-batch's backward (Megatron runs the other micro-batches under ``no_sync``); Megatron's
local DDP reduces after the backward pass; the DeepSpeed ZeRO-3 rows run with ``zero3_impl =
"deepspeed-2021"`` (`dp_comm.zero3_blocking_s`). Otherwise: micro-batch 1 when not given,
16-bit = fp16.

Software of each source (`SOURCE_RUN`): both papers predate FlashAttention (2022), so
attention is unfused (the score matrix goes through DRAM); Narayanan's Megatron-LM (April
2021) blocks on every TP all-reduce, Korthikanti's (2022) overlaps the backward TP
collectives with the weight-gradient GEMMs (async all-reduce; with sequence parallelism the
all-gather and reduce-scatter of the column-parallel linears).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forecast.files import read_json
from simulator.e2e_validate import read_label
from simulator.errors import ConfigError
from simulator.models import DEFAULT_DATA_DIR
from simulator.scenario import Scenario, parse_scenario, resolve
from simulator.simulate import latency_table, simulate

SHARED_DATA = DEFAULT_DATA_DIR.parent
LABEL_GPU = Path("labels") / "NVIDIA_A100-SXM4-40GB"  # under a NeuSight data folder
LABEL_DIR = DEFAULT_DATA_DIR / LABEL_GPU
PUBLISHED = SHARED_DATA / "published" / "dev_runs.json"
LABEL_LAYOUTS = {
    "dp4": {"dp": 4, "micro_batch_size": 1},
    "tp4": {"tp": 4, "dp": 1, "micro_batch_size": 4},
    "pp4_1": {"pp": 4, "dp": 1, "micro_batch_size": 4},
}


@dataclass(frozen=True, slots=True)
class Check:
    """One measured-vs-predicted pair."""

    name: str
    metric: str
    measured: float
    predicted: float
    error: float  # signed relative error of the compared quantity
    simulate_s: float = 0.0


def label_scenario(
    layout: str, *, latency_model: str = "auto", data_dir: Path = DEFAULT_DATA_DIR
) -> Scenario:
    """The scenario of one NeuSight A100-SXM4-40GB distributed label."""
    raw = {
        "study": {"name": f"gpt2-large-{layout}"},
        "model": {
            "hf_config": str(data_dir / "models" / "gpt2_large.json"),
            "seq_len": 1024,
        },
        "cluster": {
            "gpu": "a100-sxm4-40gb",
            "server": "dgx-a100",
            "num_gpus": 4,
            "gpus_per_node": 4,
        },
        "training": {
            "global_batch_size": 4,
            "dtype": "fp32",
            "framework": "megatron",
            "latency_model": latency_model,
        },
        "run": {"overlap_grad_reduce": False, **LABEL_LAYOUTS[layout]},
    }
    return parse_scenario(raw, source=f"label {layout}", base_dir=Path("."))


# Megatron-LM of 2021-22 sends pipeline activations and gradients synchronously (p2p
# overlap with compute came later, as an option for interleaved schedules).
SOURCE_RUN: dict[str, dict[str, Any]] = {
    "B_narayanan2021": {"tp_comm_overlap": False, "pp_blocking_sends": True},
    "C_korthikanti2022": {"tp_comm_overlap": True, "pp_blocking_sends": True},
}


def _source_run(row: dict[str, Any]) -> dict[str, Any]:
    return next((v for k, v in SOURCE_RUN.items() if row["group"].startswith(k)), {})


# (micro_batch_size, layers per virtual pipeline stage or 0, DDP implementation)
_TABLE_1 = {
    "1.7B_32gpu": (16, 0, "torch"),
    "3.6B_64gpu": (16, 0, "torch"),
    "7.5B_128gpu": (16, 0, "torch"),
    "18.4B_256gpu": (8, 0, "torch"),
    "39.1B_512gpu": (4, 0, "local"),
    "76.1B_1024gpu": (2, 5, "local"),
    "145.6B_1536gpu": (2, 5, "local"),
    "310.1B_1920gpu": (1, 3, "local"),
    "529.6B_2520gpu": (1, 1, "local"),
    "1008.0B_3072gpu": (1, 0, "local"),
}
STATED: dict[str, tuple[int, int, str]] = {f"narayanan21_t1_{k}": v for k, v in _TABLE_1.items()}
DDP_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP bucket_cap_mb


def _stated(row: dict[str, Any]) -> tuple[int, int, str]:
    """(micro-batch size, virtual stages per pipeline stage, DDP implementation) of a row."""
    found = next((v for k, v in STATED.items() if row["id"].startswith(k)), None)
    if found is not None:
        mbs, per_virtual_stage, ddp = found
        v = row["n_layers"] // (row["pp"] * per_virtual_stage) if per_virtual_stage else 1
        return mbs, v, ddp
    ddp = "deepspeed" if row["optimizer_sharding"].startswith("ZeRO-3") else "local"
    return row["micro_batch_size"] or 1, row["virtual_pipeline_stages"] or 1, ddp


def _grad_run(row: dict[str, Any], ddp: str) -> dict[str, Any]:
    """DP gradient reduction: overlapped (PyTorch DDP buckets, DeepSpeed) or after backward."""
    if ddp == "local":
        return {"overlap_grad_reduce": False}
    if ddp == "deepspeed":
        return {"overlap_grad_reduce": True}
    h, layers = row["hidden_size"], row["n_layers"]
    params = (12 * h * h * layers + row["vocab_size"] * h) / (row["tp"] * row["pp"])
    return {"overlap_grad_reduce": True, "buckets": max(1, round(2 * params / DDP_BUCKET_BYTES))}


def _published_run(row: dict[str, Any]) -> dict[str, Any]:
    """The ``[run]`` table of a ``dev_runs.json`` row: its stated layout, the settings it leaves
    null (`_stated`), its DP gradient reduction and its source's software (`SOURCE_RUN`)."""
    mbs, v, ddp = _stated(row)
    return {
        "tp": row["tp"],
        "pp": row["pp"],
        "dp": row["dp"],
        "cp": row["cp"] or 1,
        "micro_batch_size": mbs,
        "schedule": "1f1b-interleaved" if v > 1 else "1f1b",
        "virtual_stages": v,
        "sequence_parallel": bool(row["sequence_parallel"]),
        "recompute": "full" if row["recompute"].startswith("full") else "selective",
        "zero_stage": 3 if ddp == "deepspeed" else 0,
        **({"zero3_impl": "deepspeed-2021"} if ddp == "deepspeed" else {}),
        **_grad_run(row, ddp),
        **_source_run(row),
    }


def published_scenario(row: dict[str, Any], *, latency_model: str = "auto") -> Scenario:
    """A scenario from one ``dev_runs.json`` row (inferences: module docstring)."""
    model_keys = ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "ffn_hidden_size")
    run = _published_run(row)
    raw = {
        "study": {"name": row["id"]},
        "model": {
            **{k: row[k] for k in model_keys},
            "vocab_size": row["vocab_size"],
            "seq_len": row["seq_len"],
        },
        "cluster": {
            "gpu": "a100-sxm4-80gb",
            "server": "dgx-a100",
            "network": "ib-hdr",
            "num_gpus": row["num_gpus"],
            "gpus_per_node": row["gpus_per_node"],
        },
        "training": {
            "global_batch_size": row["global_batch_size"],
            "dtype": "fp16",
            "framework": "megatron",
            "attention": "unfused",
            "latency_model": latency_model,
        },
        "run": run,
    }
    return parse_scenario(raw, source=row["id"], base_dir=Path("."))


def _run(s: Scenario) -> tuple[Any, float]:
    import time

    inputs = resolve(s)
    table = latency_table(inputs, [s.run])
    t0 = time.perf_counter()
    result = simulate(inputs, s.run, table)
    return result, time.perf_counter() - t0


def check_labels(*, latency_model: str = "auto", data_dir: Path = DEFAULT_DATA_DIR) -> list[Check]:
    """GPT-2 Large DP4 / TP4 / PP4 on A100-SXM4-40GB: forward+backward time."""
    out = []
    for layout in LABEL_LAYOUTS:
        label = data_dir / LABEL_GPU / f"gpt2_large-train-1024-4-{layout}.json"
        measured_s = read_label(label, ("e2e_latency",))["e2e_latency"] / 1e3
        scenario = label_scenario(layout, latency_model=latency_model, data_dir=data_dir)
        res, took = _run(scenario)
        err = res.forward_backward_s / measured_s - 1
        out.append(
            Check(f"gpt2-large {layout}", "fw+bw s", measured_s, res.forward_backward_s, err, took)
        )
    return out


def load_published(path: Path) -> list[dict[str, Any]]:
    """The runs of a ``dev_runs.json``: a non-empty JSON list of objects with a text ``id``;
    anything else is a `ConfigError` naming the file."""
    fix = "give the published runs (shared/data/published/dev_runs.json)"
    rows = read_json(path, ConfigError, "JSON", fix)
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{path}: expected a non-empty JSON list of runs; {fix}")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise ConfigError(f"{path}: run {i} is not an object with a text id; {fix}")
    return rows


def _measured(row: dict[str, Any]) -> tuple[str, float]:
    """(metric, measured value) of a published run, a positive finite number."""
    m = row["measured"]
    metric, key = (
        ("TFLOP/s", "tflops_per_gpu")
        if "tflops_per_gpu" in m
        else ("iteration s", "iteration_time_s")
    )
    value = float(m[key])
    if not 0 < value < math.inf:
        raise ValueError(f"measured.{key} must be a positive number, got {m[key]!r}")
    return metric, value


def check_published(*, latency_model: str = "auto", path: Path = PUBLISHED) -> list[Check]:
    """Every published development run: TFLOP/s per GPU (or iteration time)."""
    out = []
    for row in load_published(path):
        try:
            metric, meas = _measured(row)
            scenario = published_scenario(row, latency_model=latency_model)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            why = f"lacks {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
            raise ConfigError(f"{path}: run {row['id']}: {why}") from None
        res, took = _run(scenario)
        if metric == "TFLOP/s":
            pred = res.hardware_tflops_per_gpu
            out.append(Check(row["id"], metric, meas, pred, pred / meas - 1, took))
        else:
            pred = res.iteration_s
            out.append(Check(row["id"], metric, meas, pred, meas / pred - 1, took))
    return out


def markdown(checks: list[Check]) -> str:
    """The README table: measured, predicted, error, simulate time."""
    lines = [
        "| run | metric | measured | predicted | error | simulate ms |",
        "|---|---|---|---|---|---|",
    ]
    for c in checks:
        lines.append(
            f"| {c.name} | {c.metric} | {c.measured:.4g} | {c.predicted:.4g} | "
            f"{c.error * 100:+.1f}% | {c.simulate_s * 1e3:.0f} |"
        )
    return "\n".join(lines)
