"""Score whole-model forecasts against the NeuSight labels; fit the overheads of `e2e`.

A label ``labels/<GPU>/<model>-<inf|train>-<seq>-<batch>.json`` holds measured HF-eager FP32
latencies in ms. The GPU folder name is the device name with spaces replaced by ``_``;
a device with no catalog entry (MI250) is read from its NeuSight device sheet, and a folder
with neither is skipped with a reason. ``torch.compile``d runs (``-fusion``) are read apart
(``load_labels(compiled=True)``, framework ``hf-compile``) and never fitted on; multi-GPU
runs (``-dp4``, ``-tp4``, ``-pp4_1``) are `dist_validate`'s.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from forecast.bandwidth import BandwidthModel
from forecast.dataset import GEMM_DIMS, ROW_DIMS, load_measurements, neusight_files
from forecast.files import read_json
from forecast.gpus import GPUError, GPUSpec, load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.predict import LatencyModel, LatencyTable
from forecast.stream import stream_table
from simulator.e2e import Overheads, predict_graph
from simulator.errors import ConfigError
from simulator.label_trace import TABLED, trace_backward_ms, trace_kernels, trace_sums
from simulator.models import ModelSpec, load_model
from simulator.opgraph import OpGraph, Phase, Workload, build_ops

TRAINING_GPUS = ("p4", "p100-pcie-16gb", "t4", "v100-pcie-32gb", "a100-pcie-40gb")
RUN_NAME = re.compile(r"^(?P<model>\w+)-(?P<mode>inf|train)-(?P<seq>\d+)-(?P<batch>\d+)$")
MODEL_ALIASES = {"switch4": "switch-base-4"}


@dataclass(frozen=True, slots=True)
class Label:
    """One measured run."""

    gpu_id: str
    gpu_folder: str
    model: str
    run: Workload
    e2e_ms: float
    fw_ms: float
    bw_ms: float
    trace_family_ms: dict[str, float] | None = None  # the run's per-op trace, per family
    trace_pass_ms: dict[str, float] | None = None  # the same trace, forward and backward

    @property
    def trace_ms(self) -> float | None:
        """The run's per-op trace summed to the full model, ms."""
        return None if self.trace_family_ms is None else sum(self.trace_family_ms.values())


@dataclass(frozen=True, slots=True)
class PreparedRun:
    """A label with its op graph and kernel forecasts (overheads applied later)."""

    label: Label
    graph: OpGraph
    table: LatencyTable


def _folder_gpu(folder: Path) -> GPUSpec | None:
    """The GPU of a label folder (its device name, spaces as ``_``): the catalog's, else the
    NeuSight device sheet of the same name (``devices/<folder>.json``: the MI250, one GCD, is
    in no catalog source), as a user without a catalog entry would run it; None if neither."""
    try:
        return load_gpu(folder.name.replace("_", " "))
    except GPUError:
        pass
    sheet = folder.parent.parent / "devices" / f"{folder.name}.json"
    try:
        return load_gpu(sheet) if sheet.is_file() else None
    except GPUError:
        return None


LABEL_TIMES = ("e2e_latency", "fw_latency", "bwall_latency")


def read_label(path: Path, times: tuple[str, ...] = LABEL_TIMES) -> dict[str, Any]:
    """A label JSON whose ``times`` (ms) are finite numbers, e2e positive (backward is 0 for
    inference, forward 0 in the 4-GPU labels); else a `ConfigError` naming file and key."""
    fix = "give the NeuSight data folder with --data"
    raw = read_json(path, ConfigError, "a JSON label", fix)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a label is a JSON object; {fix}")
    for key in times:
        v = raw.get(key)
        if not (
            isinstance(v, int | float)
            and not isinstance(v, bool)
            and math.isfinite(v)
            and (v > 0 or (v == 0 and key != "e2e_latency"))
        ):
            raise ConfigError(f"{path}: {key} must be a finite time in ms, got {v!r}; {fix}")
    return raw


def load_labels(data_dir: Path, *, compiled: bool = False) -> tuple[list[Label], dict[str, str]]:
    """All single-GPU labels of eager runs (HF eager; or with ``compiled`` the ``-fusion``
    runs, ``torch.compile``d: framework ``hf-compile``, no per-op trace), and the skipped GPU
    folders with their reason."""
    labels: list[Label] = []
    skipped: dict[str, str] = {}
    suffix, framework = ("-fusion", "hf-compile") if compiled else ("", "hf-eager")
    for folder in sorted((data_dir / "labels").iterdir()):
        gpu = _folder_gpu(folder)
        if gpu is None:
            skipped[folder.name] = "no catalog entry or device sheet for this device"
            continue
        for path in sorted(folder.glob(f"*{suffix}.json")):
            m = RUN_NAME.match(path.stem.removesuffix(suffix))
            if m is None:
                continue
            raw = read_label(path)
            run = Workload(
                batch=int(m["batch"]),
                seq=int(m["seq"]),
                mode=m["mode"],  # type: ignore[arg-type]
                framework=framework,  # type: ignore[arg-type]
            )
            model = MODEL_ALIASES.get(m["model"], m["model"])
            sums = None
            if not compiled:  # one read of the trace: per family and per pass
                sums = trace_sums(path.with_suffix(".csv.gz"), int(raw.get("num_layer") or 0))
            trace, passes = sums if sums is not None else (None, None)
            labels.append(
                Label(
                    gpu.id,
                    folder.name,
                    model,
                    run,
                    float(raw["e2e_latency"]),
                    float(raw["fw_latency"]),
                    float(raw["bwall_latency"]),
                    trace,
                    passes,
                )
            )
    return labels, skipped


def same_kernel_ratios(data_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """Per GPU and family (linear, softmax, layer norm): a label trace's call time over the
    kernel tables' time for the identical shape on the same GPU (duplicates in the tables
    averaged). Both are one PyTorch call timed the same way, so where labels and kernels were
    measured under the same conditions the ratios sit near 1; they tell how far the labels
    can be met from the kernel data at all."""
    files = [p for f in TABLED for p in neusight_files(data_dir, OpFamily(f))]
    frame = load_measurements(files).frame
    table: dict[tuple[str, str, tuple[int, ...]], float] = {}
    for fam in TABLED:
        cols = list(GEMM_DIMS if fam == OpFamily.LINEAR.value else ROW_DIMS)
        group = frame[frame["family"] == fam].groupby(["Device", *cols])["latency_s"].mean()
        for key, t in zip(group.index.tolist(), group.tolist(), strict=True):
            table[str(key[0]), fam, tuple(int(d) for d in key[1:])] = float(t)
    out: dict[str, dict[str, list[float]]] = {}
    for folder in sorted((data_dir / "labels").iterdir()):
        gpu = _folder_gpu(folder)
        if gpu is None:
            continue
        device = folder.name.replace("_", " ")
        for path in sorted(folder.glob("*.csv.gz")):
            for fam, dims, ms in trace_kernels(path):
                ref = table.get((device, fam, dims))
                if ref is not None:
                    out.setdefault(gpu.id, {}).setdefault(fam, []).append(ms * 1e-3 / ref)
    return {g: {f: np.array(r) for f, r in by.items()} for g, by in out.items()}


def prepare(labels: list[Label], data_dir: Path, latency_model: LatencyModel) -> list[PreparedRun]:
    """Build every label's op graph and forecast its kernels, one table per GPU."""
    models: dict[str, ModelSpec] = {}
    out: list[PreparedRun] = []
    by_gpu: dict[str, list[tuple[Label, OpGraph]]] = {}
    for lab in labels:
        if lab.model not in models:
            models[lab.model] = load_model(lab.model, data_dir=data_dir)
        by_gpu.setdefault(lab.gpu_id, []).append((lab, build_ops(models[lab.model], lab.run)))
    for gpu_id, items in by_gpu.items():
        # the folder's GPU, a device sheet's where the catalog has none (`_folder_gpu`)
        gpu = _folder_gpu(data_dir / "labels" / items[0][0].gpu_folder) or load_gpu(gpu_id)
        kernels = set().union(*(g.kernels() for _, g in items))
        table = stream_table(kernels, gpu, latency_model)
        out += [PreparedRun(lab, g, table) for lab, g in items]
    return out


def predicted_e2e_ms(p: PreparedRun, over: Overheads) -> float:
    """Forward (+ backward) prediction of one prepared run, ms."""
    t = predict_graph(p.graph, p.table, over)
    return (t[Phase.FORWARD] + t[Phase.BACKWARD]) * 1e3


def rel_errors(runs: list[PreparedRun], over: Overheads) -> np.ndarray:
    """Signed relative e2e errors, (pred - measured) / measured."""
    return np.array([predicted_e2e_ms(p, over) / p.label.e2e_ms - 1.0 for p in runs])


DROPOUT_CALLS = frozenset({"Dropout", "dropout"})
STREAMING_ELEMENTS = 2**21  # tensors this large stream at full speed (launch cost < 20%)


def slow_memory_ops(data_dir: Path, memory: BandwidthModel) -> dict[str, float]:
    """`forecast.bandwidth.SLOW_MEMORY_OPS` from the training traces of the kernel-training GPUs:
    per dropout row of at least `STREAMING_ELEMENTS`, its measured backward time less the
    launch over ``memory``'s bandwidth time of a ``dropout_backward`` kernel; the median."""
    ratios = []
    for folder in sorted((data_dir / "labels").iterdir()):
        gpu = _folder_gpu(folder)
        if gpu is None or gpu.id not in TRAINING_GPUS:
            continue
        for path in sorted(folder.glob("*-train-*.csv.gz")):
            for dims, ms in trace_backward_ms(path, DROPOUT_CALLS):
                if dims[0] * dims[1] < STREAMING_ELEMENTS:
                    continue
                k = KernelSpec(OpFamily.MEMORY, dims, Dtype.FP32, "dropout_backward")
                stream_s = k.bytes() / (memory.efficiency * gpu.hbm_bw_bytes_per_s)
                ratios.append((ms * 1e-3 - memory.launch_s) / stream_s)
    return {"dropout_backward": round(float(np.median(ratios)), 2)} if ratios else {}


def fit_overheads(runs: list[PreparedRun]) -> Overheads:
    """Grid search of (gap_s, host_s) minimising mean |error| on the training GPUs' runs."""
    train = [p for p in runs if p.label.gpu_id in TRAINING_GPUS]
    best = (np.inf, Overheads(gap_s=0.0, host_s=0.0))
    for gap_us in np.arange(0.0, 20.01, 0.5):
        for host_us in np.arange(0.0, 60.01, 2.5):
            over = Overheads(gap_s=gap_us * 1e-6, host_s=host_us * 1e-6)
            err = float(np.mean(np.abs(rel_errors(train, over))))
            best = min(best, (err, over), key=lambda x: x[0])
    used = tuple(sorted({p.label.gpu_id for p in train}))
    return best[1].model_copy(update={"fitted_on": used})
