"""GPU specifications: the catalog (one TOML file per GPU) and NeuSight device JSON files.

Every quantity is SI with the unit in its name. A catalog file's stem is its id, equal to
the id in ``shared/data/hardware/gpus.json`` (``h100-sxm5-80gb``). ``load_gpu`` accepts an
id, a path to a catalog TOML, a path to a NeuSight device JSON, or a NeuSight device name
("NVIDIA A100 80GB PCIe").
"""

from __future__ import annotations

import json
import tomllib
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from forecast.kernels import Dtype

CATALOG_DIR = Path(__file__).parent / "data" / "gpus"


class GPUError(ValueError):
    """A GPU that cannot be found or read; the message names the fix."""


class GPUSpec(BaseModel):
    """One GPU model. Peak rates are dense (no sparsity), at the boost clock."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    name: str
    vendor: str
    architecture: str
    compute_capability: str = Field(description="NVIDIA sm version ('8.0') or AMD ISA ('gfx90a')")
    process_nm: float | None = Field(
        default=None, gt=0, description="process node of the GPU die, nm class (TSMC 4N: 5)"
    )
    num_sms: int = Field(gt=0, description="SMs (NVIDIA) or compute units (AMD)")
    fp32_lanes_per_sm: int = Field(gt=0, description="FP32 FMA lanes per SM or CU")
    fp32_dedicated_lanes_per_sm: int = Field(
        gt=0,
        description="FP32 lanes not shared with INT32 (GA10x/AD10x: 64 of 128); = lanes elsewhere",
    )
    boost_clock_hz: float = Field(gt=0)
    base_clock_hz: float | None = Field(default=None, gt=0)
    tdp_w: float | None = Field(default=None, gt=0)
    memory_type: str = Field(default="unknown", description="DRAM technology: HBM2e, GDDR6, ...")
    hbm_bytes: float = Field(gt=0)
    hbm_bw_bytes_per_s: float = Field(gt=0)
    l2_bytes: float = Field(gt=0)
    smem_bytes_per_sm: float | None = Field(default=None, gt=0)
    regs_bytes_per_sm: float | None = Field(default=None, gt=0)
    peak_flops_per_s: dict[Dtype, float] = Field(
        description="dense peak per dtype: fp32 = CUDA-core/vector rate, others = tensor/matrix"
    )
    fp32_matrix_flops_per_s: float | None = Field(
        default=None, gt=0, description="AMD 'Matrix FP32' (MFMA) peak, used by FP32 GEMMs"
    )
    neusight_names: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def peak_for(self, dtype: Dtype) -> float:
        """Peak FLOP/s for a dtype, or a `GPUError` naming the dtypes this GPU supports."""
        if dtype not in self.peak_flops_per_s:
            have = ", ".join(sorted(self.peak_flops_per_s))
            raise GPUError(f"{self.id} has no {dtype.value} peak in its catalog; it has: {have}")
        return self.peak_flops_per_s[dtype]


def _from_toml(path: Path) -> GPUSpec:
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise GPUError(f"cannot read GPU file {path}: {e}") from e
    raw.setdefault("id", path.stem)
    try:
        return GPUSpec.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise GPUError(f"{path}: field {loc!r}: {first['msg']}") from e


def _from_neusight_json(path: Path) -> GPUSpec:
    """Read a NeuSight device sheet (MHz, GB, GB/s, GFLOP/s, MB) into SI units."""
    try:
        raw = json.loads(path.read_text())
        name = str(raw["Device"])
        fp32 = float(raw.get("SingleFLOPs") or raw.get("SingleFLOPsVEC"))
        # AMD sheets count SIMD units in Core_Per_SM (4): where it is off from the FP32 peak
        # by more than 2x, the lanes follow from the peak instead.
        lanes = int(raw["Core_Per_SM"])
        implied = fp32 * 1e9 / (2 * int(raw["Num_Sm"]) * float(raw["Freq"]) * 1e6)
        if not 0.5 < lanes / implied < 2.0:
            lanes = round(implied)
        spec = GPUSpec(
            id=name.lower().replace(" ", "-"),
            name=name,
            vendor="AMD" if name.startswith("AMD") else "NVIDIA",
            architecture="unknown",
            compute_capability="unknown",
            num_sms=int(raw["Num_Sm"]),
            fp32_lanes_per_sm=lanes,
            fp32_dedicated_lanes_per_sm=lanes,
            boost_clock_hz=float(raw["Freq"]) * 1e6,
            hbm_bytes=float(raw["Dev_Mem"]) * 1e9,
            hbm_bw_bytes_per_s=float(raw["Mem_Bw"]) * 1e9,
            l2_bytes=float(raw["L2Cache"]) * 1e6,
            peak_flops_per_s={Dtype.FP32: fp32 * 1e9},
            neusight_names=(name,),
            sources=(f"NeuSight device sheet {path.name}",),
        )
    except (OSError, ValueError, KeyError, TypeError, ValidationError) as e:
        raise GPUError(f"cannot read NeuSight device file {path}: {e}") from e
    return _with_catalog_facts(spec)


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
        raise GPUError(f"GPU file {path} does not exist")
    raise GPUError(
        f"unknown GPU {text!r}: use a catalog id ({', '.join(list_gpus())}), "
        "a device name, or a path to a .toml catalog file or NeuSight device .json"
    )
