"""The GPU catalog (forecast/data/gpus/*.toml) and the NeuSight device-sheet reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forecast.gpus import CATALOG_DIR, GPUError, gpu_id_for_device, list_gpus, load_gpu
from forecast.kernels import Dtype

SHARED = Path(__file__).resolve().parents[3] / "shared"
GPUS_JSON = SHARED / "data" / "hardware" / "gpus.json"
NEUSIGHT_DEVICES = SHARED / "data" / "neusight" / "devices"
CATALOG_FILES = sorted(CATALOG_DIR.glob("*.toml"))

NEUSIGHT_IDS = {
    "Tesla P4": "p4",
    "Tesla P100-PCIE-16GB": "p100-pcie-16gb",
    "Tesla T4": "t4",
    "Tesla V100-PCIE-32GB": "v100-pcie-32gb",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA A100-SXM4-40GB": "a100-sxm4-40gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA L4": "l4",
    "NVIDIA H100 80GB HBM3": "h100-sxm5-80gb",
    "AMD Instinct MI100": "mi100",
    "AMD Instinct MI210": "mi210",
    # PyTorch's names of GPUs the collector may measure (`tc-calibrate --measured`)
    "NVIDIA H200": "h200-sxm-141gb",
    "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
    "NVIDIA L40S": "l40s",
}


def _neusight_files() -> list[Path]:
    if not NEUSIGHT_DEVICES.is_dir():
        pytest.skip(f"NeuSight device sheets not found at {NEUSIGHT_DEVICES}")
    return sorted(NEUSIGHT_DEVICES.glob("*.json"))


@pytest.mark.parametrize("path", CATALOG_FILES, ids=lambda p: p.stem)
def test_every_catalog_file_loads_with_its_stem_as_id(path: Path) -> None:
    gpu = load_gpu(path)
    assert gpu.id == path.stem
    assert load_gpu(path.stem) == gpu
    assert Dtype.FP32 in gpu.peak_flops_per_s
    assert gpu.sources


def test_catalog_ids_equal_the_ids_of_gpus_json() -> None:
    if not GPUS_JSON.is_file():
        pytest.skip(f"shared hardware data not found at {GPUS_JSON}")
    expected = {record["id"] for record in json.loads(GPUS_JSON.read_text())}
    assert set(list_gpus()) == expected


@pytest.mark.parametrize(("device", "gpu_id"), sorted(NEUSIGHT_IDS.items()))
def test_neusight_device_names_map_to_catalog_ids(device: str, gpu_id: str) -> None:
    assert gpu_id_for_device(device) == gpu_id
    assert load_gpu(device).id == gpu_id


def test_only_the_listed_gpus_carry_neusight_names() -> None:
    named = {gid for gid in list_gpus() if load_gpu(gid).neusight_names}
    assert named == set(NEUSIGHT_IDS.values())


def test_every_neusight_device_sheet_loads() -> None:
    # but the tensor-parallel pair's sheet (2 GPUs' memory, a tensor rate as SingleFLOPs),
    # refused in test_gpu_files_s14.py
    files = [p for p in _neusight_files() if not p.stem.endswith("_TP")]
    assert files
    for path in files:
        gpu = load_gpu(path)
        assert gpu.num_sms > 0
        assert gpu.peak_flops_per_s[Dtype.FP32] > 0


def test_neusight_sheet_agrees_with_catalog_on_a100_pcie_80gb() -> None:
    _neusight_files()
    path = NEUSIGHT_DEVICES / "NVIDIA_A100_80GB_PCIe.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    sheet = load_gpu(path)
    assert sheet.id == "a100-pcie-80gb"
    assert sheet.num_sms == load_gpu("a100-pcie-80gb").num_sms
    assert sheet.process_nm == load_gpu("a100-pcie-80gb").process_nm == 7


@pytest.mark.parametrize("gpu_id", list_gpus())
def test_every_catalog_gpu_names_its_process_node(gpu_id: str) -> None:
    # bmm's power feature scales by it; a GPU without it would be read as a 12 nm die
    assert load_gpu(gpu_id).process_nm in {5, 6, 7, 12, 16}


@pytest.mark.parametrize("gpu_id", list_gpus())
def test_fp32_peak_matches_sms_lanes_and_boost_clock(gpu_id: str) -> None:
    gpu = load_gpu(gpu_id)
    lane_rate = gpu.num_sms * gpu.fp32_lanes_per_sm * 2 * gpu.boost_clock_hz
    assert lane_rate == pytest.approx(gpu.peak_flops_per_s[Dtype.FP32], rel=0.05)
    assert gpu.fp32_dedicated_lanes_per_sm <= gpu.fp32_lanes_per_sm


def test_missing_dtype_raises_gpu_error_naming_what_exists() -> None:
    with pytest.raises(GPUError, match="fp16"):
        load_gpu("v100-sxm2-32gb").peak_for(Dtype.BF16)


def test_unknown_id_raises_gpu_error_listing_accepted_ids() -> None:
    with pytest.raises(GPUError) as excinfo:
        load_gpu("no-such-gpu")
    message = str(excinfo.value)
    assert "no-such-gpu" in message
    for gpu_id in ("h100-sxm5-80gb", "a100-sxm4-80gb", "mi300x"):
        assert gpu_id in message


def test_unknown_field_raises_gpu_error_naming_the_field(tmp_path: Path) -> None:
    text = (CATALOG_DIR / "a100-sxm4-80gb.toml").read_text()
    path = tmp_path / "bad-gpu.toml"
    path.write_text("bogus_clock_mhz = 1410\n" + text)
    with pytest.raises(GPUError, match="bogus_clock_mhz"):
        load_gpu(path)


L4_SHEET = {"Device": "NVIDIA L4", "Dev_Mem": 24, "Mem_Bw": 300, "Num_Sm": 60,
            "Core_Per_SM": 128, "Freq": 2040, "SingleFLOPs": 31334, "L2Cache": 48}  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("Num_Sm", 0),  # was ZeroDivisionError
        ("Freq", 0),  # was ZeroDivisionError
        ("SingleFLOPs", float("inf")),  # was OverflowError
        ("Mem_Bw", 0),  # was a multi-line pydantic dump naming hbm_bw_bytes_per_s
        ("Mem_Bw", -300),
        ("Mem_Bw", float("nan")),
        ("Mem_Bw", float("inf")),  # was accepted (numpy RuntimeWarning downstream)
        ("L2Cache", 0),
        ("Dev_Mem", None),  # was "float() argument must be ... 'NoneType'", naming no field
        ("SingleFLOPs", "missing"),
        ("Freq", "2040"),
        ("Num_Sm", 60.5),
    ],
)
def test_bad_neusight_sheet_number_is_one_line_naming_the_field(
    tmp_path: Path, field: str, value: object
) -> None:
    sheet = dict(L4_SHEET)
    if value == "missing":
        del sheet[field]
    else:
        sheet[field] = value
    path = tmp_path / "device.json"
    path.write_text(json.dumps(sheet))
    with pytest.raises(GPUError) as excinfo:
        load_gpu(path)
    message = str(excinfo.value)
    assert str(path) in message and repr(field) in message and "positive" in message
    assert "\n" not in message


def test_valid_neusight_sheet_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "device.json"
    path.write_text(json.dumps(L4_SHEET))
    gpu = load_gpu(path)
    assert gpu.num_sms == 60 and gpu.hbm_bw_bytes_per_s == 300e9
    assert gpu.peak_flops_per_s[Dtype.FP32] == 31334e9


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("boost_clock_hz = 1.98e9", "boost_clock_hz = inf", "boost_clock_hz"),  # printed NaN
        ("bf16 = 9.895e14", "bf16 = 0.0", "peak_flops_per_s.bf16"),  # Infinity / ZeroDivision
        ("bf16 = 9.895e14", "bf16 = -9.895e14", "peak_flops_per_s.bf16"),
        ("bf16 = 9.895e14", "bf16 = nan", "peak_flops_per_s.bf16"),
        ("fp32 = 6.7e13", "fp32 = -6.7e13", "peak_flops_per_s.fp32"),  # > peak TFLOP/s
        ("hbm_bw_bytes_per_s = 3.35e12", "hbm_bw_bytes_per_s = inf", "hbm_bw_bytes_per_s"),
    ],
)
def test_catalog_numbers_must_be_positive_and_finite(
    tmp_path: Path, old: str, new: str, key: str
) -> None:
    text = (CATALOG_DIR / "h100-sxm5-80gb.toml").read_text()
    assert old in text
    path = tmp_path / "h100-edited.toml"
    path.write_text(text.replace(old, new))
    with pytest.raises(GPUError) as excinfo:
        load_gpu(path)
    message = str(excinfo.value)
    assert str(path) in message and repr(key) in message and "positive finite" in message
    assert "\n" not in message


def test_cli_refuses_a_non_finite_catalog_value_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulator.cli import main

    text = (CATALOG_DIR / "h100-sxm5-80gb.toml").read_text()
    path = tmp_path / "h100-edited.toml"
    path.write_text(text.replace("boost_clock_hz = 1.98e9", "boost_clock_hz = inf"))
    argv = ["kernels", "predict", "--gpu", str(path), "--op", "gemm"]
    assert main([*argv, "--dims", "4096,4096,4096", "--dtype", "bf16", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "boost_clock_hz" in captured.err
    assert len(captured.err.strip().splitlines()) == 1
