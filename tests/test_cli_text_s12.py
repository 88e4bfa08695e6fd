"""``tilesim predict`` and ``simulate`` output as a user reads it: no 0.00 ms backward for an
inference pass, memory against the GPU's, the flag named in a dtype refusal, a near-miss model
name answered, and an infeasible layout's exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.e2e import E2EResult
from simulator.models import DEFAULT_DATA_DIR
from simulator.predict_commands import result_text

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"


def _result(fits: bool = True) -> E2EResult:
    return E2EResult(
        e2e_ms=30.0,
        fw_ms=10.0,
        bw_ms=20.0,
        optimizer_ms=2.0,
        by_family_ms={},
        memory_gib=3.5,
        fits=fits,
    )


def test_inference_text_prints_no_backward_or_optimizer() -> None:
    text = result_text(_result(), "inf", 74.5)
    assert "inference" in text and "bw" not in text and "optimizer" not in text
    assert "3.50 GiB: fits in the GPU's 74.5 GiB" in text


def test_training_text_sums_forward_and_backward_and_names_the_optimizer_apart() -> None:
    text = result_text(_result(fits=False), "train", 74.5)
    assert "e2e 30.00 ms" in text and "forward 10.00 + backward 20.00" in text
    assert "optimizer step 2.00 ms more" in text
    assert "does NOT fit in the GPU's 74.5 GiB" in text


def test_a_dtype_the_gpu_lacks_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["predict", "--model", "tiny-gpt", "--gpu", "a100-pcie-80gb", "--batch", "1"]
    argv += ["--seq", "64", "--mode", "inf", "--dtype", "fp8", "--framework", "megatron"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tilesim: error: --dtype fp8: a100-pcie-80gb has no fp8 peak"), err


@pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / "models" / "gpt2_large.json").is_file(),
    reason=f"needs the NeuSight model configs in {DEFAULT_DATA_DIR / 'models'}",
)
def test_a_hyphenated_neusight_name_is_answered(capsys: pytest.CaptureFixture[str]) -> None:
    """``gpt2-large`` for the data's ``gpt2_large``: the error listed no NeuSight name."""
    argv = ["predict", "--model", "gpt2-large", "--gpu", "a100-pcie-80gb", "--batch", "1"]
    assert main([*argv, "--seq", "64", "--mode", "inf"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'gpt2_large'?" in err and "bert_large" in err


def test_simulate_of_a_layout_that_does_not_fit_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The house rule: 0 ok, 1 infeasible, 2 bad input; it exited 0 with "does NOT fit"."""
    ok = main(["simulate", str(TINY), "--json"])
    assert ok == 0 and json.loads(capsys.readouterr().out)["fits"]
    big = ["--set", "model.hidden_size=16384", "--set", "model.n_heads=128"]
    assert main(["simulate", str(TINY), *big, "--set", "model.n_layers=64", "--json"]) == 1
    row = json.loads(capsys.readouterr().out)
    assert row["fits"] is False and row["reason"]
