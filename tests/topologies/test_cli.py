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
        ["--bytes", "1.5", "--gpus", "8", "--cluster", "dgx-h100"],
        ["--bytes", "1e300", "--gpus", "8", "--cluster", "dgx-h100"],
        ["--bytes", "nan", "--gpus", "8", "--cluster", "dgx-h100"],
        ["--bytes", "1e6", "--gpus", "0", "--cluster", "dgx-h100"],
        ["--bytes", "1e6", "--gpus", "1", "--cluster", "dgx-h100"],
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
    if extra[1] != "1e6":
        assert "--bytes" in err
    if extra[3] in ("0", "1"):
        assert "--gpus" in err and "2 or more" in err


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


def test_plot_path_and_min_bytes_are_checked_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # no --data folder exists here: the flags are refused before any data is read
    assert main(["collective-plot", "--data", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["collective-check", "--data", str(tmp_path), "--min-bytes", "nan"]) == 2
    assert "--min-bytes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kind", "expected"), [("models", "gpt3-175b"), ("scenarios", "gpt3-175b-h100")]
)
def test_list_models_and_scenarios(
    capsys: pytest.CaptureFixture[str], kind: str, expected: str
) -> None:
    assert main(["list", kind]) == 0
    assert expected in capsys.readouterr().out.split()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--gpus", "1"], "use --gpus 2 or more"),  # printed "algbw_GBps": Infinity
        (["--gpus", "16", "--degrade", "inter:5:3:0.5"], "--degrade inter:5:3:0.5: NODE 5"),
        (["--gpus", "16", "--degrade", "inter:0:99:0.5"], "use 0..7"),
        (["--gpus", "8", "--degrade", "intra:*:8:0.5"], "GPU 8 is outside"),
    ],
)
def test_degenerate_or_outside_the_cluster_exits_2(
    extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["collective", "--op", "all-reduce", "--bytes", "1e9", "--cluster", "dgx-h100"]
    assert main([*argv, *extra, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and needle in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_degrade_inside_the_cluster_still_slows_it(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["collective", "--op", "all-reduce", "--bytes", "1e9", "--gpus", "16"]
    argv += ["--cluster", "dgx-h100", "--algorithm", "ring", "--json"]
    assert main(argv) == 0
    base = json.loads(capsys.readouterr().out)["time_s"]
    assert main([*argv, "--degrade", "inter:1:*:0.5"]) == 0
    assert json.loads(capsys.readouterr().out)["time_s"] > base


@pytest.mark.parametrize("min_bytes", ["nan", "inf", "1e30"])
def test_check_refuses_a_min_bytes_that_leaves_no_rows(
    hardware_dir: Path, min_bytes: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["collective-check", "--data", str(hardware_dir), "--min-bytes", min_bytes]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--min-bytes" in captured.err
