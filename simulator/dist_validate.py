"""Validation of the distributed simulator: NeuSight's 4-GPU A100 labels and published runs.

* ``labels/NVIDIA_A100-SXM4-40GB``: GPT-2 Large, global batch 4, seq 1024, fp32, Megatron-LM
  through HF Accelerate on 4 GPUs (``-dp4``, ``-tp4``, ``-pp4_1``: 4 stages, 1 micro-batch);
  the label is forward+backward of one step, compared with ``forward_backward_s``.
* ``published/dev_runs.json``: Megatron-LM and DeepSpeed runs on A100-SXM4-80GB DGX nodes.
  Narayanan rows publish TFLOP/s per GPU counting the recomputed forward (compared with
  ``hardware_tflops_per_gpu``, the same eq. 3 convention); Korthikanti rows publish the
  iteration time (the TFLOP/s error is then ``measured_s / predicted_s - 1``).

Inferred where the source is silent (stated per row in ``inferred``/``notes``): micro-batch 1
when not given; interleaving with 2 chunks for Narayanan's pipelined rows where it divides
(the paper uses the interleaved schedule without listing ``v``); 16-bit = fp16; DP gradient
reduction not overlapped with backward for Megatron-LM of 2021-22, overlapped for DeepSpeed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.models import DEFAULT_DATA_DIR
from simulator.scenario import Scenario, parse_scenario, resolve
from simulator.simulate import latency_table, simulate

SHARED_DATA = DEFAULT_DATA_DIR.parent
LABEL_DIR = DEFAULT_DATA_DIR / "labels" / "NVIDIA_A100-SXM4-40GB"
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


def label_scenario(layout: str, *, latency_model: str = "auto") -> Scenario:
    """The scenario of one NeuSight A100-SXM4-40GB distributed label."""
    raw = {
        "study": {"name": f"gpt2-large-{layout}"},
        "model": {
            "hf_config": str(DEFAULT_DATA_DIR / "models" / "gpt2_large.json"),
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


def _v(row: dict[str, Any]) -> int:
    if row["virtual_pipeline_stages"]:
        return int(row["virtual_pipeline_stages"])
    pp, m = row["pp"], row["global_batch_size"] // (row["dp"] * (row["micro_batch_size"] or 1))
    ok = pp > 1 and row["n_layers"] % (2 * pp) == 0 and m % pp == 0
    return 2 if ok and row["group"].startswith("B_narayanan") and "zero3" not in row["id"] else 1


def published_scenario(row: dict[str, Any], *, latency_model: str = "auto") -> Scenario:
    """A scenario from one ``dev_runs.json`` row (inferences: module docstring)."""
    model_keys = ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "ffn_hidden_size")
    v = _v(row)
    zero3 = row["optimizer_sharding"].startswith("ZeRO-3")
    run = {
        "tp": row["tp"],
        "pp": row["pp"],
        "dp": row["dp"],
        "cp": row["cp"] or 1,
        "micro_batch_size": row["micro_batch_size"] or 1,
        "schedule": "1f1b-interleaved" if v > 1 else "1f1b",
        "virtual_stages": v,
        "sequence_parallel": bool(row["sequence_parallel"]),
        "recompute": "full" if row["recompute"].startswith("full") else "selective",
        "zero_stage": 3 if zero3 else 0,
        "overlap_grad_reduce": zero3,
    }
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


def check_labels(*, latency_model: str = "auto") -> list[Check]:
    """GPT-2 Large DP4 / TP4 / PP4 on A100-SXM4-40GB: forward+backward time."""
    out = []
    for layout in LABEL_LAYOUTS:
        measured_s = (
            json.loads((LABEL_DIR / f"gpt2_large-train-1024-4-{layout}.json").read_text())[
                "e2e_latency"
            ]
            / 1e3
        )
        res, took = _run(label_scenario(layout, latency_model=latency_model))
        err = res.forward_backward_s / measured_s - 1
        out.append(
            Check(f"gpt2-large {layout}", "fw+bw s", measured_s, res.forward_backward_s, err, took)
        )
    return out


def check_published(*, latency_model: str = "auto", path: Path = PUBLISHED) -> list[Check]:
    """Every published development run: TFLOP/s per GPU (or iteration time)."""
    out = []
    for row in json.loads(path.read_text()):
        res, took = _run(published_scenario(row, latency_model=latency_model))
        m = row["measured"]
        if "tflops_per_gpu" in m:
            meas, pred = float(m["tflops_per_gpu"]), res.hardware_tflops_per_gpu
            out.append(Check(row["id"], "TFLOP/s", meas, pred, pred / meas - 1, took))
        else:
            meas, pred = float(m["iteration_time_s"]), res.iteration_s
            out.append(Check(row["id"], "iteration s", meas, pred, meas / pred - 1, took))
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
