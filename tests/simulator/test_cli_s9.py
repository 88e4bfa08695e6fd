"""CLI messages of ``simulate``, ``predict`` and ``kernels predict``: shipped scenario ids,
flags named with their fix, ``--dims`` of the wrong length refused, ``roofline-derated`` in
``predict``, the run.dp rule's fix (found by a walk-through of the commands)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.space import find_scenario

TINY = find_scenario("tiny-gpt-8gpu")
BASE = ["predict", "--model", "tiny-gpt", "--gpu", "a100-sxm4-80gb"]


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tilesim: error: "), err
    return lines[0].removeprefix("tilesim: error: ")


def test_simulate_takes_a_shipped_id_as_sweep_does(capsys: pytest.CaptureFixture[str]) -> None:
    """It read the id as a file name: "cannot read scenario tiny-gpt-8gpu as TOML"."""
    assert main(["simulate", "tiny-gpt-8gpu", "--json"]) == 0
    by_id = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(TINY), "--json"]) == 0
    assert by_id == json.loads(capsys.readouterr().out)  # the same file, the same step


def test_simulate_unknown_id_lists_the_shipped_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "no-such-scenario"]) == 2
    line = _one_line(capsys)
    assert "'no-such-scenario'" in line and "tiny-gpt-8gpu" in line


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (["--batch", "1", "--seq", "64"], "--mode: required (inf or train)"),
        (["--seq", "64", "--mode", "inf"], "--batch: required (sequences per pass, a whole"),
        (
            ["--batch", "0", "--seq", "64", "--mode", "inf"],
            "--batch: must be a whole number > 0, got 0",
        ),
        (
            ["--batch", "1", "--seq", "-3", "--mode", "inf"],
            "--seq: must be a whole number > 0, got -3",
        ),
    ],
)
def test_predict_names_the_flag_and_the_fix(
    given: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was "run missing mode; keys: ..." and "field 'batch': Input should be greater than 0"."""
    assert main([*BASE, *given, "--latency-model", "roofline"]) == 2
    assert _one_line(capsys).startswith(line)


def test_predict_runs_lines_name_the_json_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {"model": "tiny-gpt", "gpu": "t4", "batch": 1, "seq": 32, "mode": "inf"}
    runs = tmp_path / "runs.jsonl"
    lines = [{**good, "batch": 0}, {k: v for k, v in good.items() if k != "mode"}]
    runs.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert main(["predict", "--runs", str(runs), "--latency-model", "roofline", "--json"]) == 1
    errors = [json.loads(x)["error"] for x in capsys.readouterr().out.splitlines()]
    assert errors[0] == "field 'batch': must be a whole number > 0, got 0"
    assert errors[1].startswith("run missing mode") and "--" not in errors[1]


def test_predict_takes_roofline_derated(capsys: pytest.CaptureFixture[str]) -> None:
    """Scenarios and `validate distributed` take it; predict refused it as "not a latency
    model". The roofline at sustained rates (80% of peak FLOP/s, 85% of HBM) is slower than
    the roofline at peak, kernel for kernel."""
    run = [*BASE, "--batch", "2", "--seq", "128", "--mode", "train", "--json"]
    times = {}
    for kind in ("roofline", "roofline-derated"):
        assert main([*run, "--latency-model", kind]) == 0
        times[kind] = json.loads(capsys.readouterr().out)
    assert times["roofline-derated"]["fw_ms"] > times["roofline"]["fw_ms"]
    assert times["roofline-derated"]["memory_gib"] == times["roofline"]["memory_gib"]
    assert main([*run, "--latency-model", "nope"]) == 2
    assert "roofline-derated" in _one_line(capsys)


@pytest.mark.parametrize(
    ("op", "dims", "form"),
    [
        ("bmm", "16,512,64", "4 sizes B,M,N,K"),  # ran as (1, 16, 512, 64)
        ("linear", "16,512,64", "4 sizes B,M,N,K"),
        ("bmm", "2,16,512,64,8", "4 sizes B,M,N,K"),
        ("gemm", "16,512", "3 sizes M,N,K"),  # "not enough values to unpack"
        ("gemm", "1,16,512,64", "3 sizes M,N,K"),
        ("attention", "16,512,64", "4 sizes BH,S_q,S_kv,D"),
        ("add", "16,512,64", "2 sizes B,H"),
        ("softmax", "16", "2 sizes B,H"),
    ],
)
def test_kernels_predict_refuses_dims_of_the_wrong_length(
    op: str, dims: str, form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["kernels", "predict", "--gpu", "a100-sxm4-80gb", "--op", op, "--dims", dims]
    assert main([*argv, "--model", "roofline"]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"--dims {dims!r}: --op {op} takes {form}")
    assert line.endswith(f"got {len(dims.split(','))}")


@pytest.mark.parametrize(
    ("cp", "fix"),
    [
        (2, "; set run.dp = 1 (or 0 to take the GPUs left over)"),  # 2*2*2 = 8: dp 1
        (3, "; tp*cp*pp = 12 must divide it: change run.tp, run.cp or run.pp"),
    ],
)
def test_run_dp_rule_says_the_fix(cp: int, fix: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The tiny scenario is tp 2, pp 2, dp 2 on 8 GPUs: cp 2 leaves room for dp 1 only."""
    assert main(["simulate", str(TINY), "--set", f"run.cp={cp}"]) == 2
    line = _one_line(capsys)
    assert line.startswith("run.dp: tp*cp*pp*dp = ") and line.endswith(fix)


def test_validate_e2e_readme_help_names_the_five_tables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It said "the e2e table"; --readme rewrites the five (`e2e_tables.E2E_MARKERS`)."""
    assert main(["validate", "e2e", "--help"]) == 0
    assert "rewrite the README's five e2e tables" in " ".join(capsys.readouterr().out.split())


def test_predict_runs_a_line_that_is_not_utf8_fails_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line of bytes that are not UTF-8 is that line's error; the other lines still run (the
    whole file was refused). A line that is not JSON says so."""
    good = b'{"model": "tiny-gpt", "gpu": "a100-pcie-80gb", "batch": 1, "seq": 32, "mode": "inf"}'
    runs = tmp_path / "runs.jsonl"
    runs.write_bytes(good + b'\n{"model": "\xff"}\nnot json\n' + good + b"\n")
    assert main(["predict", "--runs", str(runs), "--json"]) == 1
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o.pop("line") for o in out] == [1, 2, 3, 4]
    assert out[1]["error"] == "not UTF-8 text; write each run as UTF-8 JSON"
    assert out[2]["error"].startswith("not a JSON object: ")
    assert out[0] == out[3] and out[0]["e2e_ms"] > 0


def test_unknown_model_path_names_the_models_folder(capsys: pytest.CaptureFixture[str]) -> None:
    """An absolute path of another suffix was joined onto the models folder, so the message
    named the path's own folder as where NeuSight model names live."""
    args = ["predict", "--model", "/tmp/somewhere/runs.jsonl", "--gpu", "t4", "--batch", "1"]
    assert main([*args, "--seq", "8", "--mode", "inf"]) == 2
    err = capsys.readouterr().err
    assert "/tmp/somewhere/models" not in err and "from /tmp/somewhere," not in err
    assert "/models, or a path" in err  # the data's models folder
