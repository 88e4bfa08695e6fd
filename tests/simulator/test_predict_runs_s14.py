"""``tilesim predict --runs``: a UTF-8 file saved with a byte-order mark (audit s14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main

RUN = {"model": "tiny-gpt", "gpu": "h100-sxm5-80gb", "batch": 1, "seq": 8, "mode": "inf"}


def test_a_byte_order_mark_before_the_first_run_is_not_its_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Notepad's UTF-8 (BOM, CRLF) made line 1 "Unexpected UTF-8 BOM (decode using
    utf-8-sig)" and the command exit 1."""
    runs = tmp_path / "runs.jsonl"
    line = json.dumps(RUN).encode()
    runs.write_bytes(b"\xef\xbb\xbf" + line + b"\r\n" + line + b"\r\n")
    assert main(["predict", "--runs", str(runs), "--latency-model", "roofline"]) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [o.pop("line") for o in out] == [1, 2]
    assert out[0] == out[1] and "e2e_ms" in out[0]
