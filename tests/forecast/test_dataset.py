"""Reading measurement CSVs: schema checks, skipped rows with reasons, units."""

from __future__ import annotations

from pathlib import Path

import pytest

from forecast.dataset import DataError, load_measurements, tile_of_kernel_name

HEADER = "OPName,Latency,Device,Kernel Name,Grid x,Grid y,Grid z,B,M,N,K,H\n"


def _write(tmp_path: Path, body: str, name: str = "m.csv") -> Path:
    p = tmp_path / name
    p.write_text(HEADER + body)
    return p


def test_rows_resolve_to_families_in_seconds(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "bmm,0.5,Tesla T4,volta_sgemm_128x64_nn,1,1,2,2,8,8,8,\nln,0.25,Tesla T4,,,,,4,,,,16\n",
    )
    m = load_measurements([p])
    assert list(m.frame["family"]) == ["bmm", "layernorm"]
    assert list(m.frame["latency_s"]) == [0.5e-3, 0.25e-3]
    assert m.skipped == []


def test_unscorable_rows_are_listed_with_a_reason(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "conv,0.5,Tesla T4,,,,,1,1,1,1,\n"
        "bmm,0.5,Tesla T4,,,,,0,8,8,8,\n"
        "relu,-1,Tesla T4,,,,,2,,,,8\n",
    )
    m = load_measurements([p])
    assert m.frame.empty
    reasons = {s.row: s.reason for s in m.skipped}
    assert "unknown op 'conv'" in reasons[0]
    assert "column B" in reasons[1]
    assert "Latency" in reasons[2]


def test_rows_with_odd_shapes_devices_or_dtypes_are_skipped_not_fatal(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    p.write_text(
        "OPName,Latency,Device,B,M,N,K,H,dtype\n"
        "bmm,0.5,Tesla T4,1.5,8,8,8,,fp32\n"  # a fraction of a batch
        "bmm,0.5,Tesla T4,1e30,8,8,8,,fp32\n"  # past int64 products
        "bmm,0.5,,2,8,8,8,,fp32\n"  # no device: pandas would drop it from a groupby
        "bmm,0.5,Tesla T4,2,8,8,8,,fp64\n"
        "bmm,0.5,Tesla T4,2,8,8,8,,fp32\n"
    )
    m = load_measurements([p])
    assert list(m.frame["row"]) == [4]
    reasons = {s.row: s.reason for s in m.skipped}
    assert "column B" in reasons[0] and "column B" in reasons[1]
    assert "Device" in reasons[2] and "dtype" in reasons[3]


def test_missing_column_names_the_column(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("OPName,Device\nbmm,Tesla T4\n")
    with pytest.raises(DataError, match="Latency"):
        load_measurements([p])


def test_unreadable_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_measurements([tmp_path / "absent.csv"])


def test_tile_from_kernel_names() -> None:
    assert tile_of_kernel_name("ampere_sgemm_128x64_tn") == (128, 64)
    assert tile_of_kernel_name("volta_sgemm_32x32_sliced1x4_nn") == (32, 32)
    assert tile_of_kernel_name("cutlass_80_tensorop_s1688gemm_tilesize64x128x16_stage3") == (
        64,
        128,
    )
    assert tile_of_kernel_name("void at::native::vectorized_elementwise_kernel") is None
