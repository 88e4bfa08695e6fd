"""``tilesim predict``: JSON keys, --runs JSONL with a bad line, exit 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main

KEYS = {"e2e_ms", "fw_ms", "bw_ms", "optimizer_ms", "by_family_ms", "memory_gib", "fits"}
BASE = ["predict", "--model", "tiny-gpt", "--gpu", "v100-pcie-32gb", "--batch", "2", "--seq", "64"]


def test_predict_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--mode", "train", "--latency-model", "roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == KEYS
    assert out["e2e_ms"] == pytest.approx(out["fw_ms"] + out["bw_ms"])
    assert out["optimizer_ms"] > 0


def test_inference_e2e_is_forward(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--mode", "inf", "--latency-model", "roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["e2e_ms"] == out["fw_ms"] and out["bw_ms"] == 0


@pytest.mark.parametrize(
    "bad",
    [
        ["--model", "nope"],
        ["--gpu", "nope"],
        ["--batch", "0"],
        ["--framework", "deepspeed"],
    ],
)
def test_bad_input_exits_2(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    args = [*BASE, "--mode", "inf", "--latency-model", "roofline", "--json"]
    for i in range(0, len(bad), 2):
        if bad[i] in args:
            args[args.index(bad[i]) + 1] = bad[i + 1]
        else:
            args += bad[i : i + 2]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("tilesim: error:") and "Traceback" not in err


def test_runs_jsonl_with_one_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = {"model": "tiny-gpt", "gpu": "t4", "batch": 1, "seq": 32, "mode": "inf"}
    lines = [json.dumps(good), json.dumps({**good, "gpu": "zzz"}), json.dumps({**good, "seq": 64})]
    runs = tmp_path / "runs.jsonl"
    runs.write_text("\n".join(lines) + "\n")
    assert main(["predict", "--runs", str(runs), "--latency-model", "roofline", "--json"]) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(out) == 3
    assert set(out[0]) == KEYS and set(out[2]) == KEYS
    assert out[1]["line"] == 2 and "zzz" in out[1]["error"]


def test_trace_sum_scales_layer_zero_rows(tmp_path: Path) -> None:
    """NeuSight's recipe: layer-0 rows x num_layer + the other rows, all three latency columns."""
    import csv
    import gzip

    from simulator.e2e_validate import trace_sum_ms

    rows = [
        ("['', 'bert.embeddings']", 1.0, 2.0, 0.5),
        ("['', 'bert.encoder.layer.0']", 3.0, 4.0, 1.0),
        ("['', 'bert.encoder.layer.0', 'x']", 0.25, 0.0, 0.0),
        ("['', 'bert.encoder.layer.10']", 100.0, 0.0, 0.0),  # not layer 0: counted once
    ]
    path = tmp_path / "run.csv.gz"
    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["meta", "fw_latency", "bw_latency", "acc_latency"])
        w.writerows(rows)
    assert trace_sum_ms(path, 24) == pytest.approx((3.0 + 4.0 + 1.0 + 0.25) * 24 + 3.5 + 100.0)
    assert trace_sum_ms(tmp_path / "absent.csv.gz", 24) is None
    assert trace_sum_ms(path, 0) is None
