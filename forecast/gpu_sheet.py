"""NeuSight device sheets (``Device``, ``Num_Sm``, ``Freq`` in MHz, ``Mem_Bw`` in GB/s, ...)
read into a `GPUSpec` in SI units; `forecast.gpus.load_gpu` completes one with the catalog's
architecture facts for the same device.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from forecast.gpu_bounds import LIMITS, plausibility_error
from forecast.gpu_spec import SHEET_SOURCE, GPUError, GPUSpec, first_error
from forecast.kernels import Dtype

# NeuSight sheet field -> (unit, factor to SI, whole number)
_SHEET_FIELDS = {
    "Num_Sm": ("SMs", 1.0, True),
    "Core_Per_SM": ("lanes", 1.0, True),
    "Freq": ("MHz", 1e6, False),
    "Dev_Mem": ("GB", 1e9, False),
    "Mem_Bw": ("GB/s", 1e9, False),
    "L2Cache": ("MiB", float(2**20), False),  # vendors' cache "MB" is binary, as in the catalog
    "SingleFLOPs": ("GFLOP/s", 1e9, False),
    "SingleFLOPsVEC": ("GFLOP/s", 1e9, False),
    "SingleFLOPsMM": ("GFLOP/s", 1e9, False),
}


def _sheet_si(raw: dict[str, Any], key: str, path: Path) -> float:
    """One number of a device sheet in SI units, or a `GPUError` naming the field."""
    unit, factor, whole = _SHEET_FIELDS[key]
    value = raw.get(key)
    si = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        si = float(value) * factor if 0 < value < sys.float_info.max else math.nan
    if not (math.isfinite(si) and (not whole or si % 1 == 0)):
        got = json.dumps(value) if key in raw else "nothing"
        kind = "a positive whole number" if whole else "a positive finite number"
        raise GPUError(
            f"NeuSight device file {path}: field {key!r} must be {kind} ({unit}), got {got}"
        )
    return si


def spec_from_sheet(path: Path) -> GPUSpec:
    """Read a NeuSight device sheet (MHz, GB, GB/s, GFLOP/s, MB) into SI units."""
    raw = _sheet_json(path)
    name = raw["Device"]
    # AMD sheets give the vector rate only, as SingleFLOPsVEC
    vec = "SingleFLOPs" not in raw and "SingleFLOPsVEC" in raw
    fp32_key = "SingleFLOPsVEC" if vec else "SingleFLOPs"
    fp32 = _sheet_si(raw, fp32_key, path)
    sms, freq = int(_sheet_si(raw, "Num_Sm", path)), _sheet_si(raw, "Freq", path)
    lanes = int(_sheet_si(raw, "Core_Per_SM", path))
    implied = fp32 / (2 * sms * freq)
    lanes = _fp32_lanes(lanes, implied, path, fp32_key)
    # AMD's matrix-core FP32 rate (MFMA), which rocBLAS's FP32 GEMMs run on
    matrix = _sheet_si(raw, "SingleFLOPsMM", path) if "SingleFLOPsMM" in raw else None
    try:
        spec = GPUSpec(
            id=name.lower().replace(" ", "-"),
            name=name,
            vendor="AMD" if name.startswith("AMD") else "NVIDIA",
            architecture="unknown",
            compute_capability="unknown",
            num_sms=sms,
            fp32_lanes_per_sm=lanes,
            fp32_dedicated_lanes_per_sm=lanes,
            boost_clock_hz=freq,
            hbm_bytes=_sheet_si(raw, "Dev_Mem", path),
            hbm_bw_bytes_per_s=_sheet_si(raw, "Mem_Bw", path),
            l2_bytes=_sheet_si(raw, "L2Cache", path),
            peak_flops_per_s={Dtype.FP32: fp32},
            fp32_matrix_flops_per_s=matrix,
            neusight_names=(name,),
            sources=(f"{SHEET_SOURCE} {path.name}",),
        )
    except ValidationError as e:
        raise GPUError(f"NeuSight device file {path}: {first_error(e)}") from e
    why = plausibility_error(spec, fp32_agreement=False)
    if why:
        raise GPUError(f"NeuSight device file {path} (read into catalog fields): {why}")
    return spec


def _sheet_json(path: Path) -> dict[str, Any]:
    """A NeuSight device sheet as a JSON object with a device name, or a `GPUError`."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # ValueError: bad JSON or not UTF-8
        raise GPUError(f"cannot read NeuSight device file {path}: {e}") from e
    if not isinstance(raw, dict) or not isinstance(raw.get("Device"), str) or not raw["Device"]:
        raise GPUError(
            f"NeuSight device file {path}: field 'Device' must be the device name (a string)"
        )
    return raw


def _fp32_lanes(lanes: int, implied: float, path: Path, fp32_key: str) -> int:
    """FP32 lanes per SM: the sheet's Core_Per_SM ``lanes``, or where that is off by more than
    2x from the FP32 peak (field ``fp32_key``) the lanes it ``implied`` (AMD sheets count SIMD
    units in Core_Per_SM, 4)."""
    if not 0.5 * implied < lanes < 2.0 * implied:
        lanes = round(implied) if 1 <= implied <= LIMITS["fp32_lanes_per_sm"] else 0
    if lanes < 1:
        raise GPUError(
            f"NeuSight device file {path}: field {fp32_key!r} implies {implied:.3g} FP32 lanes "
            "per SM at Num_Sm and Freq; give one GPU's FP32 peak in GFLOP/s (1-1024 lanes an SM)"
        )
    return lanes
