"""GPU specifications: the catalog (one TOML file per GPU) and NeuSight device JSON files.

Every quantity is SI with the unit in its name. A catalog file's stem is its id, equal to
the id in ``shared/data/hardware/gpus.json`` (``h100-sxm5-80gb``). ``load_gpu`` accepts an
id, a path to a catalog TOML, a path to a NeuSight device JSON, or a NeuSight device name
("NVIDIA A100 80GB PCIe").
"""

from __future__ import annotations

import difflib
import json
import math
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from forecast.gpu_bounds import LIMITS, plausibility_error
from forecast.kernels import Dtype

CATALOG_DIR = Path(__file__).parent / "data" / "gpus"

# numbers must be numbers: pydantic's lax mode read num_sms = "132" as 132 and a rate of
# true as 1.0 (an H100 of 1 byte/s); strict ints refuse floats too (num_sms = 132.5)
_Int = Annotated[int, Strict()]
_Float = Annotated[float, Strict()]


class GPUError(ValueError):
    """A GPU that cannot be found or read; the message names the fix."""


class GPUSpec(BaseModel):
    """One GPU model. Peak rates are dense (no sparsity), at the boost clock.

    Every number is positive and finite; a dtype without a peak is left out, not set to 0.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    id: str
    name: str
    vendor: str
    architecture: str
    compute_capability: str = Field(description="NVIDIA sm version ('8.0') or AMD ISA ('gfx90a')")
    process_nm: _Float | None = Field(
        default=None, gt=0, description="process node of the GPU die, nm class (TSMC 4N: 5)"
    )
    num_sms: _Int = Field(gt=0, description="SMs (NVIDIA) or compute units (AMD)")
    fp32_lanes_per_sm: _Int = Field(gt=0, description="FP32 FMA lanes per SM or CU")
    fp32_dedicated_lanes_per_sm: _Int = Field(
        gt=0,
        description="FP32 lanes not shared with INT32 (GA10x/AD10x: 64 of 128); = lanes elsewhere",
    )
    boost_clock_hz: _Float = Field(gt=0)
    base_clock_hz: _Float | None = Field(default=None, gt=0)
    tdp_w: _Float | None = Field(default=None, gt=0)
    memory_type: str = Field(default="unknown", description="DRAM technology: HBM2e, GDDR6, ...")
    hbm_bytes: _Float = Field(gt=0)
    hbm_bw_bytes_per_s: _Float = Field(gt=0)
    l2_bytes: _Float = Field(gt=0)
    smem_bytes_per_sm: _Float | None = Field(default=None, gt=0)
    regs_bytes_per_sm: _Float | None = Field(default=None, gt=0)
    peak_flops_per_s: dict[Dtype, Annotated[float, Strict(), Field(gt=0)]] = Field(
        description="dense peak per dtype: fp32 = CUDA-core/vector rate, others = tensor/matrix"
    )
    fp32_matrix_flops_per_s: _Float | None = Field(
        default=None, gt=0, description="AMD 'Matrix FP32' (MFMA) peak, used by FP32 GEMMs"
    )
    neusight_names: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def peak_for(self, dtype: Dtype) -> float:
        """Peak FLOP/s for a dtype, or a `GPUError` naming the dtypes this GPU supports."""
        if dtype not in self.peak_flops_per_s:
            have = ", ".join(sorted(self.peak_flops_per_s))
            raise GPUError(
                f"dtype {dtype.value}: {self.id} has no {dtype.value} peak in its catalog; "
                f"use one of {have}"
            )
        return self.peak_flops_per_s[dtype]


def _first_error(e: ValidationError) -> str:
    """Pydantic's first complaint as ``field 'a.b': message`` (one line).

    An unknown key comes first, with the field it most resembles: a misspelt required field
    is both unknown and missing, and only the unknown key names what the user typed.
    """
    errors = e.errors()
    unknown = [x for x in errors if x["type"] == "extra_forbidden" and len(x["loc"]) == 1]
    if unknown:
        key = str(unknown[0]["loc"][0])
        fields = [f for f in GPUSpec.model_fields if f != "id"]
        near = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
        if near:
            return f"field {key!r} is not a GPU field; did you mean {near[0]!r}?"
        return f"field {key!r} is not a GPU field; remove it (fields: {', '.join(fields)})"
    first = errors[0]
    loc = ".".join(str(x) for x in first["loc"] if x != "[key]")  # a bad dict key: its name
    if first["type"] in ("finite_number", "greater_than"):
        return f"field {loc!r} must be a positive finite number, got {first['input']!r}"
    if first["type"] in ("int_type", "float_type"):
        return f"field {loc!r} {_not_a_number(first['type'], first['input'])}"
    return f"field {loc!r}: {first['msg']}"


def _not_a_number(kind: str, value: object) -> str:
    """Why a strict number field refused ``value`` (pydantic's int_type or float_type), and
    the fix, as TOML spells the value: "132" is a string, true a boolean."""
    want = "a positive whole number" if kind == "int_type" else "a positive number"
    if isinstance(value, bool):
        return f"must be {want}, got {json.dumps(value)}; write a number, not true or false"
    if isinstance(value, str):
        return f"must be {want}, got {json.dumps(value)}; write the number bare (no quotes)"
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return f"must be {want}, got {value!r}; write {int(value)}"
    return f"must be {want}, got {value!r}"


def _from_toml(path: Path) -> GPUSpec:
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise GPUError(f"cannot read GPU file {path}: {e}") from e
    raw.setdefault("id", path.stem)
    try:
        spec = GPUSpec.model_validate(raw)
    except ValidationError as e:
        raise GPUError(f"{path}: {_first_error(e)}") from e
    why = plausibility_error(spec)
    if why:
        raise GPUError(f"{path}: {why}")
    return spec


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


def _from_neusight_json(path: Path) -> GPUSpec:
    """Read a NeuSight device sheet (MHz, GB, GB/s, GFLOP/s, MB) into SI units."""
    raw = _read_sheet(path)
    name = raw["Device"]
    # AMD sheets give the vector rate only, as SingleFLOPsVEC
    vec = "SingleFLOPs" not in raw and "SingleFLOPsVEC" in raw
    fp32_key = "SingleFLOPsVEC" if vec else "SingleFLOPs"
    fp32 = _sheet_si(raw, fp32_key, path)
    sms, freq = int(_sheet_si(raw, "Num_Sm", path)), _sheet_si(raw, "Freq", path)
    lanes = int(_sheet_si(raw, "Core_Per_SM", path))
    implied = fp32 / (2 * sms * freq)
    lanes = _fp32_lanes(lanes, implied, path, fp32_key)
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
            neusight_names=(name,),
            sources=(f"NeuSight device sheet {path.name}",),
        )
    except ValidationError as e:
        raise GPUError(f"NeuSight device file {path}: {_first_error(e)}") from e
    why = plausibility_error(spec, fp32_agreement=False)
    if why:
        raise GPUError(f"NeuSight device file {path} (read into catalog fields): {why}")
    return _with_catalog_facts(spec)


def _read_sheet(path: Path) -> dict[str, Any]:
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


def _with_catalog_facts(spec: GPUSpec) -> GPUSpec:
    """Complete a device sheet with the catalog's architecture facts for the same device."""
    try:
        cat = _catalog_by_neusight_name()[spec.name]
    except KeyError:
        return spec
    return spec.model_copy(
        update={
            "id": cat.id,
            "architecture": cat.architecture,
            "compute_capability": cat.compute_capability,
            "process_nm": cat.process_nm,
            "fp32_dedicated_lanes_per_sm": min(
                spec.fp32_lanes_per_sm, cat.fp32_dedicated_lanes_per_sm
            ),
            "base_clock_hz": cat.base_clock_hz,
            "tdp_w": cat.tdp_w,
            "smem_bytes_per_sm": cat.smem_bytes_per_sm,
            "regs_bytes_per_sm": cat.regs_bytes_per_sm,
            "fp32_matrix_flops_per_s": cat.fp32_matrix_flops_per_s,
            "memory_type": cat.memory_type,
        }
    )


@cache
def catalog() -> dict[str, GPUSpec]:
    """All GPUs of the catalog, by id."""
    return {p.stem: _from_toml(p) for p in sorted(CATALOG_DIR.glob("*.toml"))}


@cache
def _catalog_by_neusight_name() -> dict[str, GPUSpec]:
    return {name: g for g in catalog().values() for name in g.neusight_names}


def list_gpus() -> list[str]:
    """Catalog ids, sorted."""
    return sorted(catalog())


def gpu_id_for_device(device_name: str) -> str:
    """Catalog id of a NeuSight/PyTorch device name ("Tesla T4" -> "t4")."""
    try:
        return _catalog_by_neusight_name()[device_name].id
    except KeyError:
        raise GPUError(
            f"unknown device {device_name!r}; known device names: "
            + ", ".join(sorted(_catalog_by_neusight_name()))
        ) from None


def load_gpu(name_or_path: str | Path) -> GPUSpec:
    """Load a GPU by catalog id, device name, catalog TOML path or NeuSight device JSON path."""
    text = str(name_or_path)
    if text in catalog():
        return catalog()[text]
    if text in _catalog_by_neusight_name():
        return _catalog_by_neusight_name()[text]
    path = Path(text)
    if path.suffix == ".toml" and path.is_file():
        return _from_toml(path)
    if path.suffix == ".json" and path.is_file():
        return _from_neusight_json(path)
    if path.suffix in {".toml", ".json"}:
        what = "is a folder; give the file" if path.is_dir() else "does not exist"
        raise GPUError(f"GPU file {path} {what}")
    raise GPUError(
        f"unknown GPU {text!r}: use a catalog id ({', '.join(list_gpus())}), "
        "a device name, or a path to a .toml catalog file or NeuSight device .json"
    )
