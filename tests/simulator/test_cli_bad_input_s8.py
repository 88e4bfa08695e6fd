"""Bad input to every ``tilesim`` subcommand is one line and exit 2, before any work, and no
output file is left half-written or corrupted (found by a user-path hunt over the CLI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import simulator.kernel_commands as kernel_commands
import simulator.simulate_commands as simulate_commands
from simulator.cli import main
from simulator.space import find_scenario

TINY = find_scenario("tiny-gpt-8gpu")
RUN = {"model": "tiny-gpt", "gpu": "a100-sxm4-80gb", "batch": 1, "seq": 128, "mode": "inf"}


def _one_line(capsys: pytest.CaptureFixture[str], *needles: str, prefix: str = "tilesim") -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    assert all(n in lines[0] for n in needles), err
    return lines[0]


def _never(*args: object, **kwargs: object) -> Any:
    raise AssertionError("the command started its work on bad input")


@pytest.mark.parametrize(
    ("op", "dims"),
    [("bmm", "1,128,128,99999999999999999999"), ("gemm", "8,8,99999999999999999999")],
)
def test_a_kernel_dim_past_int64_is_refused(
    op: str, dims: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was an OverflowError traceback from the tile-MLP's int64 array."""
    argv = ["kernels", "predict", "--gpu", "a100-sxm4-80gb", "--op", op, "--dims", dims]
    assert main(argv) == 2
    _one_line(capsys, "--dims", "2^40")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"a": 1}\n', "header"),  # collect appended CSV rows to this JSON
        (b"a,b\n1,2\n", "header"),  # KeyError traceback
        (b"\xff\xfe garbage", "UTF-8"),  # UnicodeDecodeError traceback
        (b"", "empty"),  # rows were appended with no header
    ],
)
def test_collect_refuses_to_resume_a_file_it_did_not_write(
    tmp_path: Path, content: bytes, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.json"
    out.write_bytes(content)
    argv = ["kernels", "collect", "--device", "cpu", "--out", str(out), "--budget-s", "1"]
    assert main(argv) == 2
    _one_line(capsys, f"--out {out}", why)
    assert out.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]  # no .meta.json either


def test_train_and_validate_check_out_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both failed (FileExistsError, IsADirectoryError) only after minutes of training."""
    import forecast.train

    monkeypatch.setattr(forecast.train, "train_model", _never)
    monkeypatch.setattr(kernel_commands, "validate", _never)
    a_file = tmp_path / "weights"
    a_file.write_text("x")
    assert main(["kernels", "train", "--out", str(a_file)]) == 2
    _one_line(capsys, f"--out {a_file}", "a file is there")
    assert main(["kernels", "validate", "--out", str(tmp_path)]) == 2
    _one_line(capsys, f"--out {tmp_path}", "is a folder")
    assert main(["kernels", "validate", "--out", str(a_file / "v.json")]) == 2
    _one_line(capsys, "not a writable folder")


def test_validate_writes_its_report_whole_into_a_new_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = {"unseen": {"t4": 1.0}}
    monkeypatch.setattr(kernel_commands, "validate", lambda data, logo: report)
    out = tmp_path / "new" / "validation.json"
    assert main(["kernels", "validate", "--out", str(out), "--no-logo"]) == 0
    assert json.loads(out.read_text()) == report
    assert [p.name for p in out.parent.iterdir()] == ["validation.json"]


def test_eval_with_no_scorable_row_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed ``skipped rows: 1`` and exited 0."""
    csv = tmp_path / "m.csv"
    csv.write_text("OPName,B,M,N,K,H,Latency,Device\nbmm,1,64,64,64,,-1,NVIDIA A100-SXM4-80GB\n")
    assert main(["kernels", "eval", "--csv", str(csv), "--model", "roofline"]) == 2
    _one_line(capsys, "--csv", "no row to score", "1 skipped", "Latency")


@pytest.mark.parametrize("override", ["model.seq_len=999999999999", f"model.seq_len={10**20}"])
def test_more_tokens_per_micro_batch_than_modelled_is_refused(
    tmp_path: Path, override: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both commands raised pydantic's ValidationError for `Workload` (a traceback); the sweep
    (micro-batch sizes 1 and 2) refuses it before writing its folder. Such a sequence is past
    `models.MAX_SEQ` (2^27 tokens) too, which is checked first."""
    assert main(["simulate", str(TINY), "--set", override]) == 2
    _one_line(capsys, "model.seq_len", "2^27")
    out = tmp_path / "sweep"
    argv = ["sweep", str(TINY), "--serial", "--no-progress", "--out", str(out), "--set", override]
    assert main(argv) == 2
    _one_line(capsys, "model.seq_len", "2^27")
    assert not out.exists()


def test_an_interrupted_trace_leaves_no_half_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def half_then_ctrl_c(timeline: object, path: Path) -> None:
        path.write_text('{"traceEvents": [')
        raise KeyboardInterrupt

    monkeypatch.setattr(simulate_commands, "write_trace", half_then_ctrl_c)
    trace = tmp_path / "step.json"
    assert main(["simulate", str(TINY), "--trace", str(trace)]) == 130
    assert list(tmp_path.iterdir()) == []


def _runs(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


def test_runs_file_mistakes_are_one_line_not_silence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty file, a bad --latency-model and flags --runs ignores all exited 0."""
    assert main(["predict", "--runs", _runs(tmp_path, "", "  ")]) == 2
    _one_line(capsys, "--runs", "no runs")
    one = _runs(tmp_path, json.dumps(RUN))
    assert main(["predict", "--runs", one, "--latency-model", "bogus"]) == 2
    _one_line(capsys, "--latency-model", "bogus")
    assert main(["predict", "--runs", one, "--batch", "4", "--latency-model", "roofline"]) == 2
    _one_line(capsys, "--runs", "--batch")


def test_a_key_given_twice_in_a_run_line_is_that_lines_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``{"batch": 1, ..., "batch": 2}`` silently ran batch 2."""
    twice = json.dumps(RUN)[:-1] + ', "batch": 2}'
    runs = _runs(tmp_path, twice, json.dumps(RUN))
    assert main(["predict", "--runs", runs, "--latency-model", "roofline"]) == 1  # one line failed
    first, second = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert first == {"line": 1, "error": "key 'batch' given twice; give each key once"}
    assert second["fits"] is True


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["sweep", str(TINY), "--top", "x"], "argument --top"),
        (["kernels"], "required: COMMAND"),
        (["validate", "bogus"], "invalid choice"),
        (["kernels", "train", "--out", ""], "argument --out: an empty path"),  # was the cwd
        (["simulate", ""], "argument scenario: an empty path"),
        (["predict", "--runs", " "], "argument --runs: an empty path"),
    ],
)
def test_a_malformed_command_line_is_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse printed its whole usage block before the error."""
    assert main(argv) == 2
    _one_line(capsys, needle, "--help`", prefix=f"tilesim {argv[0]}")


def test_an_empty_sweep_scenario_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "", "--serial"]) == 2
    _one_line(capsys, "sweep ''", "empty path")


def test_a_folder_given_as_a_file_is_called_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both said the path did not exist."""
    folder = tmp_path / "gpu.toml"
    folder.mkdir()
    assert main(["kernels", "eval", "--csv", str(folder)]) == 2
    _one_line(capsys, str(folder), "a folder")
    assert main(["kernels", "predict", "--gpu", str(folder), "--op", "add", "--dims", "1,2"]) == 2
    _one_line(capsys, str(folder), "is a folder")


def test_a_micro_batch_past_2_40_tokens_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A sequence inside `models.MAX_SEQ` whose micro-batch still passes 2^40 tokens."""
    sets = ["model.seq_len=134217728", "run.micro_batch_size=16384"]
    sets.append("training.global_batch_size=65536")
    argv = ["simulate", str(TINY), *(a for s in sets for a in ("--set", s))]
    assert main(argv) == 2
    _one_line(capsys, "model.seq_len", "micro_batch_size", "2^40")
