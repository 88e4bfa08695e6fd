"""GPU specifications: the catalog (one TOML file per GPU) and NeuSight device JSON files.

Every quantity is SI with the unit in its name. A catalog file's stem is its id, equal to
the id in ``shared/data/hardware/gpus.json`` (``h100-sxm5-80gb``). ``load_gpu`` accepts an
id, a path to a catalog TOML, a path to a NeuSight device JSON, or a NeuSight device name
("NVIDIA A100 80GB PCIe"). The record itself is `forecast.gpu_spec`'s, the sheet reader
`forecast.gpu_sheet`'s.
"""

from __future__ import annotations

import difflib
from functools import cache
from pathlib import Path

from pydantic import ValidationError

from forecast.files import read_toml
from forecast.gpu_bounds import plausibility_error
from forecast.gpu_sheet import spec_from_sheet
from forecast.gpu_spec import GPUError, GPUSpec, first_error

__all__ = [
    "CATALOG_DIR",
    "GPUError",
    "GPUSpec",
    "catalog",
    "gpu_id_for_device",
    "list_gpus",
    "load_gpu",
]

CATALOG_DIR = Path(__file__).parent / "data" / "gpus"


def _from_toml(path: Path) -> GPUSpec:
    raw = read_toml(path, "GPU file", GPUError)
    raw.setdefault("id", path.stem)
    try:
        spec = GPUSpec.model_validate(raw)
    except ValidationError as e:
        raise GPUError(f"{path}: {first_error(e)}") from e
    why = plausibility_error(spec)
    if why:
        raise GPUError(f"{path}: {why}")
    return spec


def _with_catalog_facts(spec: GPUSpec) -> GPUSpec:
    """Complete a device sheet with the catalog's architecture facts for the same device,
    its tensor-core peaks among them (a sheet gives FP32 alone). An HBM device's ``Dev_Mem``
    counts GiB, as `forecast.gpu_spec` explains (an H100 sheet's 80 read as 80e9 bytes left
    it 73.5 usable GiB where the catalog's H100 has 79)."""
    try:
        cat = _catalog_by_neusight_name()[spec.name]
    except KeyError:
        return spec
    hbm = cat.memory_type.upper().startswith("HBM")
    return spec.model_copy(
        update={
            "hbm_bytes": spec.hbm_bytes / 1e9 * 2**30 if hbm else spec.hbm_bytes,
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
            "peak_flops_per_s": {**cat.peak_flops_per_s, **spec.peak_flops_per_s},
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
        return _with_catalog_facts(spec_from_sheet(path))
    if path.suffix in {".toml", ".json"}:
        what = "is a folder; give the file" if path.is_dir() else "does not exist"
        raise GPUError(f"GPU file {path} {what}")
    raise GPUError(
        f"unknown GPU {text!r}{_did_you_mean(text)}: use a catalog id ({', '.join(list_gpus())}), "
        "a device name as PyTorch prints it (e.g. 'NVIDIA A100-SXM4-80GB'), or a path to a "
        ".toml catalog file or NeuSight device .json"
    )


def _did_you_mean(text: str) -> str:
    """`` (did you mean 'ID'?)`` for a catalog name as `tilesim list gpus` prints it ("A100
    SXM4 80GB"), an id in other case or spacing, or a near miss of an id; else empty."""
    key = " ".join(text.lower().split())
    by_name = {g.name.lower(): gpu_id for gpu_id, g in catalog().items()}
    ids = list_gpus()
    found = by_name.get(key) or next((i for i in ids if i == key.replace(" ", "-")), None)
    close = [found] if found else difflib.get_close_matches(key, ids, n=1, cutoff=0.8)
    return f" (did you mean {close[0]!r}?)" if close else ""
