"""`tilesim kernels ...`: JSON output, scoring files, and one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("model", ["tile-mlp", "roofline"])
def test_predict_prints_latency_json(capsys: pytest.CaptureFixture[str], model: str) -> None:
    args = ("kernels", "predict", "--gpu", "l4", "--op", "bmm", "--dims", "8,512,64,512")
    code, out, _ = _run(capsys, *args, "--model", model, "--json")
    assert code == 0
    latency = json.loads(out)["latency_s"]
    assert 1e-6 < latency < 1.0


def test_predict_is_monotone_in_work(capsys: pytest.CaptureFixture[str]) -> None:
    times = []
    for b in (64, 1024):
        args = ("kernels", "predict", "--gpu", "a100-pcie-80gb", "--op", "linear")
        _, out, _ = _run(capsys, *args, "--dims", f"1,{b * 16},4096,4096", "--json")
        times.append(json.loads(out)["latency_s"])
    assert times[1] > 4 * times[0]


def test_predict_reads_a_neusight_device_sheet(
    capsys: pytest.CaptureFixture[str], neusight_dir: Path
) -> None:
    sheet = neusight_dir / "devices" / "NVIDIA_L4.json"
    args = ("kernels", "predict", "--gpu", str(sheet), "--op", "softmax", "--dims", "4096,1024")
    code, out, _ = _run(capsys, *args, "--json")
    assert code == 0 and json.loads(out)["latency_s"] > 0


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--op", "conv9d", "--dims", "1,2"], "--op"),
        (["--op", "bmm", "--dims", "1,-2,3,4"], "positive"),
        (["--op", "bmm", "--dims", "1,0,3,4"], "positive"),
        (["--op", "bmm", "--dims", "a,b"], "--dims"),
        (["--op", "bmm", "--dims", "1,2,3,4", "--dtype", "fp64"], "--dtype"),
        (["--op", "bmm", "--dims", "1,2,3,4", "--model", "oracle"], "--model"),
    ],
)
def test_bad_predict_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, out, err = _run(capsys, "kernels", "predict", "--gpu", "t4", *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_unknown_gpu_lists_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("kernels", "predict", "--gpu", "z9000", "--op", "bmm", "--dims", "1,2,3,4")
    code, _, err = _run(capsys, *args)
    assert code == 2 and "h100-sxm5-80gb" in err


def test_eval_scores_and_lists_skipped_rows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    csv = tmp_path / "m.csv"
    csv.write_text(
        "OPName,Latency,Device,B,M,N,K,H\n"
        "bmm,0.05,NVIDIA L4,8,256,64,256,\n"
        "gelu,0.02,NVIDIA L4,1024,,,,1024\n"
        "gelu,0.02,Some Future GPU,1024,,,,1024\n"
        "conv,0.02,NVIDIA L4,1,1,1,1,\n"
    )
    code, out, _ = _run(capsys, "kernels", "eval", "--csv", str(csv), "--json")
    result = json.loads(out)
    assert code == 0
    assert result["bmm"]["n"] == 1 and result["elementwise"]["n"] == 1
    assert {s["row"] for s in result["skipped"]} == {2, 3}
    assert {"n", "mape_pct", "median_ape_pct", "p90_ape_pct"} <= set(result["bmm"])


def test_eval_skips_a_dtype_the_model_does_not_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    csv = tmp_path / "m.csv"
    csv.write_text(
        "OPName,Latency,Device,B,M,N,K,H,dtype\n"
        "bmm,0.05,NVIDIA L4,8,256,64,256,,fp32\n"
        "bmm,0.05,Tesla P4,8,256,64,256,,bf16\n"  # tile-mlp is fp32 only
    )
    code, out, _ = _run(capsys, "kernels", "eval", "--csv", str(csv), "--json")
    result = json.loads(out)
    assert code == 0 and result["bmm"]["n"] == 1
    assert [s["row"] for s in result["skipped"]] == [1]
    assert "bf16" in result["skipped"][0]["reason"]


@pytest.mark.parametrize(
    ("content", "needle"),
    [("OPName,Device\nbmm,x\n", "Latency"), (None, "no such file")],
)
def test_bad_eval_file_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, needle: str
) -> None:
    csv = tmp_path / "bad.csv"
    if content is not None:
        csv.write_text(content)
    code, _, err = _run(capsys, "kernels", "eval", "--csv", str(csv), "--json")
    assert code == 2 and needle in err and err.count("\n") == 1


def test_plot_writes_a_png(
    capsys: pytest.CaptureFixture[str], neusight_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "k.png"
    code, _, _ = _run(capsys, "kernels", "plot", "--data", str(neusight_dir), "--out", str(out))
    assert code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["", "noext", "k.xyz"])
def test_plot_refuses_a_path_it_cannot_write_a_figure_to(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    out = tmp_path / name if name else tmp_path  # "" = an existing folder
    code, _, err = _run(capsys, "kernels", "plot", "--out", str(out))
    assert code == 2 and "--out" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["kernels", "predict", "--gpu", "t4", "--op", "gemm", "--dims", "-1,64,64"],
            "--dims '-1,64,64': each size must be a positive whole number, got -1",
        ),
        (
            [
                "collective",
                "--op",
                "all-reduce",
                "--bytes",
                "-1e9",
                "--gpus",
                "8",
                "--cluster",
                "dgx-a100",
            ],
            "--bytes -1e+09: give a whole number of bytes",
        ),
    ],
)
def test_a_negative_value_reaches_its_own_rule(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse read "-1,64,64" as a flag: "argument --dims: expected one argument"."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_kernel_larger_than_the_gpus_memory_prints_its_forecast_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A 200,000^3 bf16 GEMM (224 GiB of operands) on an 80 GiB A100 exited 0 unremarked."""
    argv = ["kernels", "predict", "--gpu", "a100-sxm4-80gb", "--op", "gemm", "--dtype", "bf16"]
    assert main([*argv, "--dims", "200000,200000,200000"]) == 1
    out = capsys.readouterr().out
    assert "latency" in out and "does NOT fit: its operands and result take 223.5 GiB" in out
    assert main([*argv, "--dims", "200000,200000,200000", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["latency_s"] > 0 and "does not fit" in captured.err
    assert main([*argv, "--dims", "2000,2000,2000"]) == 0
