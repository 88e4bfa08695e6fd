from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main


def test_collective_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["collective", "--op", "all-reduce", "--bytes", "1e9", "--gpus", "16"]
    assert main([*argv, "--cluster", "dgx-h100", "--network", "ib-ndr", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["time_s", "algbw_GBps", "busbw_GBps", "algorithm"]
    assert out["busbw_GBps"] == pytest.approx(out["algbw_GBps"] * 2 * 15 / 16)
    assert out["time_s"] == pytest.approx(1e9 / (out["algbw_GBps"] * 1e9))


def test_collective_forced_algorithm(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["collective", "--op", "all-reduce", "--bytes", "1e9", "--gpus", "8"]
    assert main([*argv, "--cluster", "dgx-h100", "--algorithm", "ring", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["algorithm"] == "ring"


@pytest.mark.parametrize(
    "extra",
    [
        ["--bytes", "0", "--gpus", "8", "--cluster", "dgx-h100"],
        ["--bytes", "1e6", "--gpus", "8", "--cluster", "no-such-box"],
        ["--bytes", "1e6", "--gpus", "99999999", "--cluster", "dgx-h100"],
        ["--bytes", "1e6", "--gpus", "16", "--cluster", "dgx-h100", "--network", "x"],
        ["--bytes", "1e6", "--gpus", "8", "--cluster", "dgx-a100", "--algorithm", "nvls"],
        ["--bytes", "1e6", "--gpus", "8", "--cluster", "dgx-a100", "--degrade", "bad"],
    ],
)
def test_bad_input_exit_2(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collective", "--op", "all-reduce", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tilesim: error:") and "\n" not in err


@pytest.mark.parametrize("kind", ["gpus", "servers", "networks"])
def test_list(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", kind]) == 0
    assert len(capsys.readouterr().out.splitlines()) >= 8


def test_list_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "bananas"]) == 2


def test_check_and_plot(
    hardware_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["collective-check", "--data", str(hardware_dir)]) == 0
    assert "| dgx-a100 | 8 |" in capsys.readouterr().out
    out = tmp_path / "b.png"
    assert main(["collective-plot", "--data", str(hardware_dir), "--out", str(out)]) == 0
    assert out.exists()


@pytest.mark.parametrize(
    ("kind", "expected"), [("models", "gpt3-175b"), ("scenarios", "gpt3-175b-h100")]
)
def test_list_models_and_scenarios(
    capsys: pytest.CaptureFixture[str], kind: str, expected: str
) -> None:
    assert main(["list", kind]) == 0
    assert expected in capsys.readouterr().out.split()
