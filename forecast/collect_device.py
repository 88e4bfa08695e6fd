"""What the collector records of its device: the L2 it flushes before each timed call, the
software versions of every row, and the metadata file beside the CSV (name, SMs, L2, memory,
clocks, driver, versions, timing method). Imported by `forecast.profile` only, which the CLI
imports lazily; imports on a CPU-only machine.
"""

from __future__ import annotations

import platform
import subprocess
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from forecast.profile import CollectConfig


def l2_bytes(device: str) -> int:
    """The device's L2 cache (1 MiB taken for the CPU)."""
    if device == "cpu":
        return 1 << 20
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 50 << 20))


def flush_bytes(device: str) -> int:
    """The buffer written before each timed call: twice the L2 (120 MiB on an H200)."""
    return 2 * l2_bytes(device)


def software_versions() -> dict[str, object]:
    """The row's software columns, as NeuSight's tables carry them."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "Torch Version": torch.__version__,
        "CUDNN Version": cudnn or "",
        "CUDA Version": torch.version.cuda or "",
    }


def nvidia_smi() -> dict[str, str] | None:
    """Driver, clocks (now and maximum, SM and memory) and power limit, as nvidia-smi reads
    them; None where it cannot run."""
    query = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem"
    query += ",power.limit,temperature.gpu"
    try:
        res = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {"query": query, "value": (res.stdout or res.stderr).strip()}


def device_metadata(device: str, cfg: CollectConfig | None = None) -> dict[str, object]:
    """GPU (or CPU) name, SMs, L2, memory, clocks, driver, torch, CUDA and cuDNN versions, and
    how the kernels are timed. ``nvidia_smi`` is read now (idle clocks); `collect` adds
    ``nvidia_smi_end``, read after the last kernel."""
    versions = software_versions()
    meta: dict[str, object] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    meta["cudnn"] = versions["CUDNN Version"] or None
    if cfg is not None:
        meta["timing"] = {
            "warmup": cfg.warmup,
            "repeats": cfg.repeats,
            "statistic": "median",
            "timer": "perf_counter" if device == "cpu" else "cuda_event",
            "l2_flush_bytes": flush_bytes(device),
        }
    if device == "cpu":
        meta.update(device_name=platform.processor() or platform.machine(), device="cpu")
        return meta
    props = torch.cuda.get_device_properties(device)
    meta.update(device_name=props.name, sms=props.multi_processor_count)
    meta.update(compute_capability=f"{props.major}.{props.minor}")
    meta.update(l2_bytes=l2_bytes(device), total_memory_bytes=int(props.total_memory))
    meta["nvidia_smi"] = nvidia_smi()
    return meta
