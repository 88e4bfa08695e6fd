"""GPU files a user writes: numbers no GPU comes near, an FP32 peak its SMs, lanes and clock
do not deliver, or none at all, are one line naming the field and exit 2; before, they were
forecast (an FP32 GEMM at 265% of the stated peak, a bf16 GEMM at 27 years) or printed the
forecast's header before failing."""

from __future__ import annotations

from pathlib import Path

import pytest

from forecast.gpus import CATALOG_DIR, GPUError, load_gpu
from simulator.cli import main

A100 = CATALOG_DIR / "a100-sxm4-80gb.toml"
NEUSIGHT_DEVICES = Path(__file__).resolve().parents[3] / "shared" / "data" / "neusight" / "devices"


def _edited(tmp_path: Path, old: str, new: str) -> Path:
    text = A100.read_text()
    assert old in text
    path = tmp_path / "gpu.toml"
    path.write_text(text.replace(old, new))
    return path


CASES = [
    ("num_sms = 108", "num_sms = 99999999999999999", "'num_sms' must be at most"),
    ("num_sms = 108", "num_sms = 1e300", "'num_sms' must be a positive whole number, got 1e+300"),
    ("hbm_bw_bytes_per_s = 2.039e12", "hbm_bw_bytes_per_s = 1e308", "'hbm_bw_bytes_per_s' must"),
    ("fp16 = 3.12e14", "fp16 = 3.12e30", "'peak_flops_per_s.fp16' must be at most"),
    ("num_sms = 108", "num_sms = 216", "'peak_flops_per_s.fp32' is 1.95e+13 FLOP/s but"),
    ("fp32 = 1.95e13", "", "'peak_flops_per_s.fp32' is missing"),
]


@pytest.mark.parametrize(("old", "new", "needle"), CASES)
def test_an_implausible_gpu_file_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, needle: str
) -> None:
    path = _edited(tmp_path, old, new)
    argv = ["kernels", "predict", "--gpu", str(path), "--op", "gemm", "--dims", "64,64,64"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and needle in err and len(err.strip().splitlines()) == 1
    assert "write 1000" not in err


def test_a_gpu_with_more_sms_and_its_peaks_scaled_still_loads(tmp_path: Path) -> None:
    text = A100.read_text().replace("num_sms = 108", "num_sms = 216")
    for old in ("1.95e13", "1.56e14", "3.12e14"):
        text = text.replace(f"= {old}", f"= {2 * float(old)}")
    path = tmp_path / "what-if.toml"
    path.write_text(text)
    assert load_gpu(path).num_sms == 216


def test_the_tensor_parallel_neusight_sheet_is_refused_naming_its_fp32_field() -> None:
    path = NEUSIGHT_DEVICES / "NVIDIA_H100_80GB_HBM3_TP.json"
    if not path.is_file():
        pytest.skip(f"{path} not found (clone without ../shared)")
    with pytest.raises(GPUError, match=r"field 'SingleFLOPs' implies 3.79e\+03 FP32 lanes"):
        load_gpu(path)
