"""`kernels eval` names the file and line of every skipped row, whatever the number of files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main

HEADER = "OPName,Latency,Device,B,M,N,K,H\n"


def test_skipped_rows_name_their_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(HEADER + "bmm,0.05,NVIDIA L4,8,256,64,256,\nfrobnicate,0.1,NVIDIA L4,1,,,,64\n")
    b.write_text(
        HEADER
        + "ln,0.02,NVIDIA L4,1024,,,,1024\n"
        + "ln,0.02,No Such GPU,1024,,,,1024\n"
        + "ln,-1,NVIDIA L4,1024,,,,1024\n"
    )
    args = ["kernels", "eval", "--csv", str(a), str(b), "--model", "roofline", "--json"]
    assert main(args) == 0
    skipped = json.loads(capsys.readouterr().out)["skipped"]
    where = {(s["row"], s["file"], s["line"]) for s in skipped}
    # global rows 1 (a.csv line 3), 3 (b.csv line 3: unknown GPU), 4 (b.csv line 4)
    assert where == {(1, str(a), 3), (3, str(b), 3), (4, str(b), 4)}
    reasons = {s["line"]: s["reason"] for s in skipped if s["file"] == str(b)}
    assert "No Such GPU" in reasons[3] and "Latency" in reasons[4]


def test_nothing_to_score_names_the_first_skipped_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = tmp_path / "a.csv"
    a.write_text(HEADER + "frobnicate,0.1,NVIDIA L4,1,,,,64\n")
    assert main(["kernels", "eval", "--csv", str(a), "--json"]) == 2
    err = capsys.readouterr().err
    assert f"{a} line 2: unknown op 'frobnicate'" in err and len(err.strip().splitlines()) == 1
