"""Audit of every catalog entry against shared/data/hardware, and of a user's own GPU files.

Each GPU, server and network id is compared field by field with its vetted record after
unit conversion (SI, per direction, dense FLOP/s); a value the vetted record lacks (null) must
come from the record's ``unverified`` object or be left to the TOML line that names its
source. Then: a user's copy of a catalog GPU with one field changed is read and priced from
the file; a missing or misspelt field is one line naming it, exit code 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from forecast.gpus import CATALOG_DIR, GPUError, GPUSpec, list_gpus, load_gpu
from forecast.kernels import Dtype
from simulator.cli import main
from topologies import list_networks, list_servers, load_network
from topologies.spec import ClusterSpec, LinkTier, NetworkSpec, NVLSSpec, ServerSpec

from .conftest import SHARED

GIB = 2**30
MIB = 2**20
KIB = 2**10

# gpus.json README: every *_dense_* peak is dense; TFLOP/s = 1e12 FLOP/s
PEAK_KEYS = {
    Dtype.FP32: "fp32_vector_tflops",
    Dtype.TF32: "tf32_dense_tflops",
    Dtype.FP16: "fp16_dense_tflops",
    Dtype.BF16: "bf16_dense_tflops",
    Dtype.FP8: "fp8_dense_tflops",
}
# PCIe x16 bandwidth, both directions, by generation (gpus.json README: Gen4 64, Gen5 128 GB/s)
PCIE_X16_BIDIR_GBPS = {4: 64, 5: 128}


def _records(hardware_dir: Path, name: str) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in json.loads((hardware_dir / name).read_text())}


def _vetted(rec: dict[str, Any], key: str) -> float | None:
    """The vetted value, else the record's 'unverified' one, else None (a number or None)."""
    value = rec.get(key)
    if value is None:
        value = (rec.get("unverified") or {}).get(key)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


# --- ids and units in names -----------------------------------------------------------------


def test_catalog_ids_equal_the_shared_ids(hardware_dir: Path) -> None:
    assert set(list_gpus()) == set(_records(hardware_dir, "gpus.json"))
    servers = _records(hardware_dir, "servers.json")
    ours = {s.id for s in list_servers()}
    # the two generic PCIe boxes are ours; every other server is a vetted record
    assert ours - set(servers) == {"pcie-h100-8gpu", "pcie-l40s-8gpu"}
    networks = {r["id"] for r in json.loads((hardware_dir / "networks.json").read_text())}
    assert {n.id for n in list_networks()} <= networks


# fields that carry no unit: counts, ratios, text
UNITLESS = {
    "num_sms", "fp32_lanes_per_sm", "fp32_dedicated_lanes_per_sm", "gpus_per_node",
    "links_per_gpu", "nics_per_node", "max_nodes", "num_nodes", "nodes_per_leaf",
    "efficiency", "oversubscription", "bw_scale", "node", "local_rank", "mesh_edges",
    "host_efficiency",
}  # fmt: skip
SI_SUFFIXES = ("_hz", "_w", "_bytes", "_per_s", "_s", "_per_sm", "_nm", "_per_dir")
NON_SI = ("gb", "gib", "mb", "mib", "kb", "mhz", "ghz", "tflops", "gbps", "_ms", "_us")


@pytest.mark.parametrize(
    "model", [GPUSpec, ServerSpec, LinkTier, NVLSSpec, NetworkSpec, ClusterSpec]
)
def test_every_numeric_field_names_an_si_unit(model: type) -> None:
    for name, field in model.model_fields.items():
        text = str(field.annotation)
        if not any(t in text for t in ("float", "int")) or name in UNITLESS:
            continue
        assert name.endswith(SI_SUFFIXES), f"{model.__name__}.{name} has no SI unit suffix"
        assert not any(p in name.split("_") or name.endswith(p) for p in NON_SI), name


# --- GPUs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu_id", list_gpus())
def test_every_gpu_number_equals_its_vetted_record(gpu_id: str, hardware_dir: Path) -> None:
    rec = _records(hardware_dir, "gpus.json")[gpu_id]
    gpu = load_gpu(gpu_id)
    # gpus.json README: NVIDIA quotes memory in GB, AMD's ROCm table in GiB; caches and
    # per-SM sizes are binary (NVIDIA's "40 MB" L2 is 40 x 2^20 bytes)
    hbm = rec["vendor"] == "AMD" or str(rec.get("memory_type", "")).startswith("HBM")
    memory = GIB if hbm else 1e9  # NVIDIA's HBM "GB" are GiB (gpu_spec.GPUSpec.hbm_bytes)
    pairs: list[tuple[str, float | None, str, float]] = [
        ("num_sms", gpu.num_sms, "sm_or_cu_count", 1),
        ("boost_clock_hz", gpu.boost_clock_hz, "boost_clock_mhz", 1e6),
        ("tdp_w", gpu.tdp_w, "tdp_w", 1),
        ("hbm_bytes", gpu.hbm_bytes, "memory_gb", memory),
        ("hbm_bw_bytes_per_s", gpu.hbm_bw_bytes_per_s, "mem_bw_GBps", 1e9),
        ("l2_bytes", gpu.l2_bytes, "l2_cache_MB", MIB),
        ("smem_bytes_per_sm", gpu.smem_bytes_per_sm, "shared_mem_or_lds_per_sm_KB", KIB),
        ("regs_bytes_per_sm", gpu.regs_bytes_per_sm, "register_file_per_sm_KB", KIB),
        ("fp32_matrix_flops_per_s", gpu.fp32_matrix_flops_per_s, "fp32_matrix_tflops", 1e12),
    ]
    pairs += [
        (f"peak_flops_per_s.{d}", gpu.peak_flops_per_s.get(d), key, 1e12)
        for d, key in PEAK_KEYS.items()
    ]
    for field, ours, key, factor in pairs:
        vetted = _vetted(rec, key)
        if rec.get(key) is not None:  # a vetted number: the catalog must carry it
            assert ours is not None, f"{gpu_id}: {field} missing; gpus.json {key} = {vetted}"
        if vetted is None or ours is None:
            continue  # none in the vetted data: the TOML line names its source
        assert ours == pytest.approx(vetted * factor, rel=1e-9), f"{gpu_id}: {field} vs {key}"
    # a catalog peak for a dtype the vetted record has no number for is unfounded
    for d in gpu.peak_flops_per_s:
        assert _vetted(rec, PEAK_KEYS[d]) is not None, f"{gpu_id}: {d} peak without a source"
    assert gpu.name == rec["name"] and gpu.vendor == rec["vendor"]
    assert gpu.architecture == rec["architecture"]
    cc = rec["compute_capability_or_isa"] or (rec.get("unverified") or {}).get(
        "compute_capability_or_isa"
    )
    assert gpu.compute_capability == cc
    memory_type = rec["memory_type"] or (rec.get("unverified") or {}).get("memory_type")
    assert memory_type.startswith(gpu.memory_type)  # "GDDR6 (ECC)" is GDDR6


@pytest.mark.parametrize("gpu_id", list_gpus())
def test_tensor_peaks_are_dense(gpu_id: str) -> None:
    """Ratios a halved sparse figure cannot fake: one dtype taken from the sparse column sits
    at 2x (or 0.5x) where the architecture fixes the ratio."""
    gpu = load_gpu(gpu_id)
    p = gpu.peak_flops_per_s
    if Dtype.FP8 in p:  # Hopper, Ada, Blackwell, CDNA 3: FP8 runs at twice FP16
        assert p[Dtype.FP8] == pytest.approx(2 * p[Dtype.FP16], rel=0.02)
    if Dtype.TF32 in p:  # Ampere and later, CDNA 3: TF32 at half FP16 (3%: the B200 table
        # prints TF32 2.2 for 2.25 PFLOP/s sparse, so its vetted dense TF32 is 1.1, not 1.125)
        assert p[Dtype.TF32] == pytest.approx(p[Dtype.FP16] / 2, rel=0.03)
    if gpu.architecture != "CDNA" and Dtype.BF16 in p:  # CDNA 1 runs BF16 at half FP16
        assert p[Dtype.BF16] == pytest.approx(p[Dtype.FP16], rel=1e-3)
    if gpu.architecture == "Pascal" and Dtype.FP16 in p:  # no tensor cores: packed FP16 = 2x
        assert p[Dtype.FP16] == pytest.approx(2 * p[Dtype.FP32], rel=0.01)


# --- servers and networks ---------------------------------------------------------------------


@pytest.mark.parametrize("server", [s.id for s in list_servers()])
def test_every_server_link_is_per_direction(server: str, hardware_dir: Path) -> None:
    s = next(x for x in list_servers() if x.id == server)
    gpu = _records(hardware_dir, "gpus.json")[s.gpu]
    intra = s.intra.bw_bytes_per_s_per_dir
    if s.fabric == "pcie":
        # x16 both directions / 2 (gpus.json gives it per GPU, or its PCIe generation does)
        bidir = gpu["pcie_x16_bw_bidir_GBps"] or PCIE_X16_BIDIR_GBPS[gpu["pcie_gen"]]
        assert intra == pytest.approx(bidir / 2 * 1e9)
        assert s.links_per_gpu == 1
    else:
        # NVLink / xGMI: the vendor's sum of both directions / 2 = links x per-link rate
        assert intra == pytest.approx(gpu["scaleup_bw_total_bidir_GBps"] / 2 * 1e9)
        assert intra == pytest.approx(gpu["scaleup_bw_total_unidir_GBps"] * 1e9)
        assert s.links_per_gpu == gpu["scaleup_links_per_gpu"]
        per_link = gpu["scaleup_bw_per_link_unidir_GBps"] * 1e9  # NVLink 2-4: 25, 5: 50 GB/s
        assert intra / s.links_per_gpu == pytest.approx(per_link)
    rec = _records(hardware_dir, "servers.json").get(server)
    if rec is None:
        return  # a generic box: its NIC count is an assumption its TOML names
    assert s.gpu in rec["gpu_model"] and s.gpus_per_node == rec["gpus_per_node"]
    assert intra == pytest.approx(rec["per_gpu_fabric_bw_unidir_GBps"] * 1e9)
    assert intra == pytest.approx(rec["per_gpu_fabric_bw_bidir_GBps"] / 2 * 1e9)
    if rec["compute_nic_count"] is not None:
        assert s.nics_per_node == rec["compute_nic_count"]
        net = load_network(s.default_network or "")
        # Gb/s line rate / 8 = bytes/s each way (400 Gb/s NDR: 50 GB/s per direction)
        assert net.link.bw_bytes_per_s_per_dir == pytest.approx(
            rec["compute_nic_speed_Gbps"] * 1e9 / 8
        )
        per_gpu = s.nics_per_node / s.gpus_per_node * net.link.bw_bytes_per_s_per_dir
        assert per_gpu == pytest.approx(rec["per_gpu_scaleout_Gbps"] * 1e9 / 8)


@pytest.mark.parametrize("network", [n.id for n in list_networks()])
def test_every_network_port_rate_per_direction(network: str, hardware_dir: Path) -> None:
    rec = _records(hardware_dir, "networks.json")[network]
    bw = load_network(network).link.bw_bytes_per_s_per_dir
    assert bw == pytest.approx(rec["port_rate_Gbps"] * 1e9 / 8)
    assert bw == pytest.approx(rec["port_rate_GBps_per_direction"] * 1e9)
    if rec["lanes_per_port"] is not None:  # 4 lanes x lane rate = port rate
        assert rec["lanes_per_port"] * rec["lane_rate_Gbps"] == rec["port_rate_Gbps"]


def test_default_fabric_is_non_blocking(hardware_dir: Path) -> None:
    # networks.json: the SuperPOD compute fabrics are full fat trees (1:1), SU = 32 DGX H100/B200
    spec = ClusterSpec(server=list_servers()[0], network=None, num_nodes=1)
    assert spec.oversubscription == 1.0
    su = _records(hardware_dir, "networks.json")["superpod-dgx-h100"]["used_in"]
    assert f"SU = {spec.nodes_per_leaf} DGX H100" in su


# --- a user's own GPU file --------------------------------------------------------------------

A100 = CATALOG_DIR / "a100-sxm4-80gb.toml"
A100_BW = "hbm_bw_bytes_per_s = 2.039e12"


def _kernels_cli(gpu: Path | str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    # fp32 add of 2^26 elements on the roofline: memory-bound, 3 x 4 x 2^26 bytes moved
    argv = ["kernels", "predict", "--gpu", str(gpu), "--op", "add", "--dims", f"1,{2**26}"]
    rc = main([*argv, "--model", "roofline", "--json"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_users_copy_with_one_field_changed_is_read_from_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = A100.read_text()
    assert A100_BW in text
    # the same stem as the catalog's file, in another folder: the file wins, not the catalog
    path = tmp_path / "a100-sxm4-80gb.toml"
    path.write_text(text.replace(A100_BW, "hbm_bw_bytes_per_s = 1.0e12"))
    assert load_gpu(path).hbm_bw_bytes_per_s == 1.0e12
    assert load_gpu("a100-sxm4-80gb").hbm_bw_bytes_per_s == 2.039e12
    rc, out, _ = _kernels_cli(path, capsys)
    assert rc == 0
    assert json.loads(out)["latency_s"] == pytest.approx(3 * 4 * 2**26 / 1.0e12, rel=1e-9)
    rc, out, _ = _kernels_cli("a100-sxm4-80gb", capsys)
    assert json.loads(out)["latency_s"] == pytest.approx(3 * 4 * 2**26 / 2.039e12, rel=1e-9)


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("num_sms = 108", "", "num_sms"),  # missing
        (A100_BW, "", "hbm_bw_bytes_per_s"),  # missing
        ("[peak_flops_per_s]", "[peak_flops]", "peak_flops"),  # misspelt table
        (A100_BW, "hbm_bw_bytes_per_sec = 2.039e12", "hbm_bw_bytes_per_sec"),  # misspelt
        ("l2_bytes = ", "l2_byte = ", "l2_byte"),  # misspelt
        ("tdp_w = ", "tdp_watts = ", "tdp_watts"),  # misspelt optional field
        ("bf16 = 3.12e14", "bf61 = 3.12e14", "peak_flops_per_s.bf61"),  # misspelt dtype
    ],
)
def test_missing_or_misspelt_field_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, named: str
) -> None:
    text = A100.read_text()
    assert old in text
    path = tmp_path / "my-gpu.toml"
    path.write_text(text.replace(old, new, 1))
    rc, out, err = _kernels_cli(path, capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert repr(named) in err, err


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("hbm_bw_bytes_per_sec", "hbm_bw_bytes_per_s"),
        ("l2_byte", "l2_bytes"),
        ("tdp_watts", "tdp_w"),
        ("peak_flops", "peak_flops_per_s"),
    ],
)
def test_misspelt_field_names_the_field_it_was_meant_to_be(
    tmp_path: Path, typed: str, meant: str
) -> None:
    # before: a misspelt required field read "field 'hbm_bw_bytes_per_s': Field required",
    # naming a field the user believes they gave and never the key they typed
    text = A100.read_text()
    line = next(x for x in text.splitlines() if x.startswith((f"{meant} ", f"[{meant}]")))
    path = tmp_path / "my-gpu.toml"
    path.write_text(text.replace(line, line.replace(meant, typed, 1), 1))
    with pytest.raises(GPUError) as excinfo:
        load_gpu(path)
    message = str(excinfo.value)
    assert repr(typed) in message and repr(meant) in message and "\n" not in message


def test_unknown_field_without_a_near_name_lists_the_fields(tmp_path: Path) -> None:
    path = tmp_path / "my-gpu.toml"
    path.write_text("colour = 'green'\n" + A100.read_text())
    with pytest.raises(GPUError) as excinfo:
        load_gpu(path)
    message = str(excinfo.value)
    assert "'colour'" in message and "num_sms" in message and "\n" not in message


# --- a NeuSight device sheet: the same units as the catalog -----------------------------------

SHEET = SHARED / "data" / "neusight" / "devices" / "NVIDIA_A100_80GB_PCIe.json"


def test_neusight_sheet_l2_is_read_in_binary_megabytes(tmp_path: Path) -> None:
    if not SHEET.is_file():
        pytest.skip(f"NeuSight device sheet not found at {SHEET} (checkout without ../shared)")
    # the sheet's L2Cache 40 (MB) is NVIDIA's 40 MB L2 = 40 x 2^20 bytes (gpus.json README:
    # caches are binary), the catalog's l2_bytes; it was read as 40e6, 4.6% small
    assert json.loads(SHEET.read_text())["L2Cache"] == 40
    assert load_gpu(SHEET).l2_bytes == 40 * MIB == load_gpu("a100-pcie-80gb").l2_bytes
    sheet = json.loads(SHEET.read_text()) | {"Device": "My GPU", "L2Cache": 6}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(sheet))
    assert math.isclose(load_gpu(path).l2_bytes, 6 * MIB)
