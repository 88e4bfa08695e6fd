"""An AMD NeuSight device sheet read on its own (no catalog entry for the device): its
matrix-core FP32 rate (``SingleFLOPsMM``) is the GEMM peak, as the catalog's AMD entries give
it, and whole-model validation scores a label folder of such a device (the MI250) through its
sheet instead of skipping it. Roofline reads AMD FP32 GEMMs against that matrix peak too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forecast.dataset import load_measurements
from forecast.evaluate import device_rows, unseen_devices, vendor_files
from forecast.features import gemm_rate_flops_per_s
from forecast.gpus import GPUError, load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.predict import load_latency_model
from simulator.e2e_validate import load_labels

NEUSIGHT = Path(__file__).resolve().parents[3] / "shared" / "data" / "neusight"
# an AMD device no catalog has: one CDNA-2-like GCD (vector FP32 = 2 x CUs x 64 x clock)
SHEET = {
    "Device": "AMD Instinct MI999",
    "Dev_Mem": 64,
    "Mem_Bw": 1600,
    "Num_Sm": 100,
    "Core_Per_SM": 4,
    "Freq": 1500,
    "SingleFLOPsMM": 38400,
    "SingleFLOPsVEC": 19200,
    "L2Cache": 8,
}


def _sheet(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "AMD_Instinct_MI999.json"
    sheet = {k: v for k, v in (SHEET | changes).items() if v is not None}
    path.write_text(json.dumps(sheet))
    return path


def test_an_amd_sheet_gives_its_matrix_rate_as_the_fp32_gemm_peak(tmp_path: Path) -> None:
    gpu = load_gpu(_sheet(tmp_path))
    assert gpu.vendor == "AMD"
    assert gpu.peak_flops_per_s[Dtype.FP32] == 19200e9  # vector: element-wise work
    assert gpu.fp32_matrix_flops_per_s == 38400e9  # MFMA: rocBLAS's FP32 GEMMs
    assert load_gpu(_sheet(tmp_path, SingleFLOPsMM=None)).fp32_matrix_flops_per_s is None


def test_the_tile_model_prices_gemms_at_the_sheets_matrix_rate(tmp_path: Path) -> None:
    """Before, the sheet's matrix rate was dropped and GEMM tiles ran at the vector rate."""
    gpu = load_gpu(_sheet(tmp_path))
    assert gemm_rate_flops_per_s(gpu, Dtype.FP32) * gpu.num_sms == pytest.approx(38400e9)
    vector = load_gpu(_sheet(tmp_path, SingleFLOPsMM=None))
    assert gemm_rate_flops_per_s(vector, Dtype.FP32) * vector.num_sms == pytest.approx(19200e9)


@pytest.mark.parametrize("value", [0, -1, "45300", float("inf")])
def test_a_bad_matrix_rate_is_one_line_naming_the_field(tmp_path: Path, value: object) -> None:
    path = _sheet(tmp_path, SingleFLOPsMM=value)
    with pytest.raises(GPUError) as e:
        load_gpu(path)
    assert "'SingleFLOPsMM'" in str(e.value) and str(path) in str(e.value)
    assert "\n" not in str(e.value)


def _labels(tmp_path: Path, folder: str) -> Path:
    runs = tmp_path / "labels" / folder
    runs.mkdir(parents=True)
    label = {"e2e_latency": 10.0, "fw_latency": 10.0, "bwall_latency": 0}
    (runs / "gpt2_large-inf-1024-4.json").write_text(json.dumps(label))
    return tmp_path


def test_a_label_folder_of_a_device_with_only_a_sheet_is_scored(tmp_path: Path) -> None:
    data = _labels(tmp_path, "AMD_Instinct_MI999")
    (data / "devices").mkdir()
    _sheet(data / "devices")
    labels, skipped = load_labels(data)
    assert skipped == {}
    assert [(lab.gpu_id, lab.gpu_folder, lab.e2e_ms) for lab in labels] == [
        ("amd-instinct-mi999", "AMD_Instinct_MI999", 10.0)
    ]


def test_a_folder_with_neither_catalog_entry_nor_sheet_is_skipped_with_why(
    tmp_path: Path,
) -> None:
    labels, skipped = load_labels(_labels(tmp_path, "Some_Other_GPU"))
    assert labels == []
    assert skipped == {"Some_Other_GPU": "no catalog entry or device sheet for this device"}


def test_the_neusight_mi250_labels_are_scored_through_their_sheet() -> None:
    if not (NEUSIGHT / "labels" / "AMD_Instinct_MI250").is_dir():
        pytest.skip(f"NeuSight labels not found at {NEUSIGHT} (clone without ../shared)")
    labels, skipped = load_labels(NEUSIGHT)
    assert skipped == {}
    mi250 = [lab for lab in labels if lab.gpu_folder == "AMD_Instinct_MI250"]
    assert len(mi250) == 16 and {lab.gpu_id for lab in mi250} == {"amd-instinct-mi250"}


def test_roofline_reads_an_amd_fp32_gemm_against_the_matrix_peak(tmp_path: Path) -> None:
    """As the tile model does: a large GEMM at the matrix rate; a row kernel and a GEMM on a
    GPU without a matrix rate at the dtype's peak."""
    roofline = load_latency_model("roofline")
    gemm = KernelSpec(OpFamily.BMM, (1, 8192, 8192, 8192), Dtype.FP32)
    mm = roofline.predict_s([gemm], load_gpu(_sheet(tmp_path)))[0]
    vector = roofline.predict_s([gemm], load_gpu(_sheet(tmp_path, SingleFLOPsMM=None)))[0]
    assert mm == pytest.approx(gemm.flops() / 38400e9, rel=1e-12)
    assert vector == pytest.approx(gemm.flops() / 19200e9, rel=1e-12)
    h100 = load_gpu("h100-sxm5-80gb")
    assert roofline.predict_s([gemm], h100)[0] >= gemm.flops() / h100.peak_for(Dtype.FP32)


def test_roofline_bounds_every_measured_amd_gemm_from_below() -> None:
    """A roofline is a bound: no AMD FP32 GEMM row of the NeuSight data runs faster than it
    (at the vector peak 20-77% of them did, up to 1.49x)."""
    if not NEUSIGHT.is_dir():
        pytest.skip(f"NeuSight data not found at {NEUSIGHT} (clone without ../shared)")
    roofline = load_latency_model("roofline")
    for family in ("bmm", "linear"):
        rows = load_measurements(vendor_files(NEUSIGHT, family))
        for device in unseen_devices(rows):
            mine = device_rows(rows, device)
            bound = roofline.predict_s(mine.kernels(), load_gpu(device))
            assert (mine.frame["latency_s"].to_numpy() >= bound).all(), (family, device)
