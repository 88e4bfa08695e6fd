"""Hostile and mistaken input, round four (an audit of every subcommand on 2026-12-07): each
case below printed a traceback, an absurd number with exit 0, or a misleading line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from forecast.dataset import default_data_dir
from forecast.files import read_capped
from forecast.gpus import CATALOG_DIR, load_gpu
from simulator.cli import main
from simulator.space import find_scenario
from tests.support import edited, one_line_refusal, refused

TINY = find_scenario("tiny-gpt-8gpu")
SHEETS = default_data_dir() / "devices"
needs_sheets = pytest.mark.skipif(
    not SHEETS.is_dir(), reason=f"NeuSight device sheets not found at {SHEETS} (../shared)"
)


# --- numbers past any fabric ----------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "65"])
def test_an_oversubscription_past_any_fat_tree_is_refused_by_name(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """inf crashed the cluster check with a pydantic traceback; 1e300 printed a 300-digit step."""
    refused(
        ["simulate", str(TINY), "--set", f"cluster.oversubscription={value}"],
        capsys,
        "cluster.oversubscription",
    )
    refused(
        ["collective", "--op", "all-reduce", "--cluster", "dgx-h100", "--bytes", "1e9",
         "--gpus", "16", "--oversubscription", value],
        capsys,
        "--oversubscription",
        "to 64",
    )  # fmt: skip


def test_sixty_four_to_one_is_still_a_fat_tree(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(TINY), "--set", "cluster.oversubscription=64", "--json"]) == 0
    assert math.isfinite(json.loads(capsys.readouterr().out)["iteration_s"])


def test_a_node_with_more_nics_than_any_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """1e20 NICs passed as "a multiple of the GPUs"."""
    argv = ["simulate", str(TINY), "--set", f"cluster.nics_per_node={10**20}"]
    refused(argv, capsys, "cluster.nics_per_node", "1024")


def test_degradations_of_one_link_multiply_down_to_a_floor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """110 flags of 0.001 multiplied to 0: `{"time_s": Infinity}`, which is not JSON."""
    argv = ["collective", "--op", "all-reduce", "--cluster", "dgx-h100", "--bytes", "1e9"]
    argv += ["--gpus", "8", "--json"]
    assert main([*argv, "--degrade", "intra:*:*:0.001"]) == 0
    once = json.loads(capsys.readouterr().out)
    assert main([*argv, *["--degrade", "intra:*:*:0.001"] * 110]) == 0
    many = json.loads(capsys.readouterr().out)
    assert math.isfinite(many["time_s"]) and many == once


# --- files that cannot be read or written ---------------------------------------------------


def test_an_endless_file_is_refused_not_read_until_memory_runs_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    refused(["simulate", "/dev/zero"], capsys, "/dev/zero", "more than 16 MiB")
    with pytest.raises(ValueError, match="more than"):
        read_capped(Path("/dev/zero"), 2**10)
    refused(["kernels", "eval", "--csv", "/dev/zero", "--json"], capsys, "not a regular file")


def test_a_scenario_with_a_byte_order_mark_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Some Windows editors write one: "Invalid statement (at line 1, column 1)"."""
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + TINY.read_bytes())
    assert main(["simulate", str(bom), "--json"]) == 0
    with_bom = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(TINY), "--json"]) == 0
    assert with_bom == json.loads(capsys.readouterr().out)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_output_to_a_full_device_is_one_line_not_a_traceback() -> None:
    """``tilesim list gpus > /dev/full`` ended in an OSError traceback."""
    with open("/dev/full", "w") as full:
        p = subprocess.run(
            [sys.executable, "-m", "simulator", "list", "gpus"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert p.returncode == 2
    one_line_refusal(p.stderr, "No space left on device", "free space")


# --- what the user asked for cannot run -----------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp32", "tf32"])
def test_flash_attention_in_fp32_is_refused(dtype: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It was priced (1.400 ms) with FlashAttention kernels that do not exist in fp32, and let
    context parallelism, refused for fp32 otherwise, run."""
    argv = ["simulate", str(TINY), "--set", 'training.attention="flash"']
    refused([*argv, "--set", f'training.dtype="{dtype}"'], capsys, "training.attention", dtype)


def test_a_study_name_of_two_lines_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A newline in it put a second heading in the report and split the summary line."""
    refused(
        ["simulate", str(TINY), "--set", 'study.name="my study\\n# injected"'],
        capsys,
        "study.name",
        "one line",
    )


@needs_sheets
def test_a_device_sheet_takes_the_catalog_tensor_core_peaks() -> None:
    """A sheet gives FP32 alone; bf16 on it said "l4 has no bf16 peak in its catalog", while
    ``--gpu l4`` ran bf16."""
    sheet = load_gpu(SHEETS / "NVIDIA_L4.json")
    assert sheet.peak_flops_per_s.keys() == load_gpu("l4").peak_flops_per_s.keys()
    assert sheet.peak_flops_per_s["fp32"] != load_gpu("l4").peak_flops_per_s["fp32"]  # its own


@needs_sheets
def test_a_sheet_without_a_catalog_twin_names_the_sheet(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["kernels", "predict", "--gpu", str(SHEETS / "AMD_Instinct_MI250.json")]
    refused([*argv, "--op", "bmm", "--dims", "1,64,64,64", "--dtype", "bf16"], capsys,
            "NeuSight device sheet", "no bf16 peak")  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("hbm_bw_bytes_per_s", "1e-3", "at least 1e+09"),
        ("memory_type", '"XYZ"', "DRAM technology"),
    ],
)
def test_a_gpu_file_with_no_dram_to_speak_of_is_refused(
    key: str, value: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1e-3 B/s forecast a linear layer at 3.6e9 s; "XYZ" was read as GDDR without a word."""
    gpu = edited(CATALOG_DIR / "l4.toml", key, value, tmp_path / "l4.toml")
    refused(["kernels", "predict", "--gpu", str(gpu), "--op", "bmm", "--dims", "1,64,64,64"],
            capsys, key, needle)  # fmt: skip


def test_a_trace_in_a_new_folder_is_written_as_figures_are(tmp_path: Path) -> None:
    """``--plot`` and ``kernels plot --out`` make missing folders; ``--trace`` refused them."""
    trace = tmp_path / "new" / "deeper" / "step.json"
    assert main(["simulate", str(TINY), "--trace", str(trace)]) == 0
    assert json.loads(trace.read_text())["traceEvents"]


ARGMAX_MODULE = """
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(64, 64)
    def forward(self, x):
        y = self.l(x)
        return {ret}
def build(b, s):
    return M(), (torch.randn(b, s, 64),)
"""


def _module_run(tmp_path: Path, ret: str, mode: str) -> list[str]:
    path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.py"  # a new module name each time
    path.write_text(ARGMAX_MODULE.format(ret=ret))
    argv = ["predict", "--module", f"{path}:build", "--gpu", "a100-pcie-80gb", "--batch", "2"]
    return [*argv, "--seq", "16", "--mode", mode, "--json"]


def test_training_through_an_integer_output_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A module returning ``argmax`` was priced a backward (0.026 ms) that PyTorch refuses."""
    refused(_module_run(tmp_path, "y.argmax(-1)", "train"), capsys, "carry no gradient", "--mode")
    assert main(_module_run(tmp_path, "y.argmax(-1)", "inf")) == 0  # a forward is fine
    capsys.readouterr()
    # beside a floating-point output, an integer one changes nothing: no gradient flows back
    # through it
    assert main(_module_run(tmp_path, "y", "train")) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main(_module_run(tmp_path, "(y, y.argmax(-1))", "train")) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["bw_ms"] == alone["bw_ms"] > 0
