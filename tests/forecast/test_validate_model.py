"""`tilesim kernels validate` scores the committed weights on the unseen GPUs where they were
trained on the data at hand: a retrain under other library versions gives other weights
(`forecast.train.trained_with`), and the README table must be the forecaster users run."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import forecast.train
from forecast.evaluate import shipped_or_trained
from forecast.tile_mlp import TileMLPModel


def test_the_committed_weights_are_scored_on_their_own_data(neusight_dir: Path) -> None:
    model, scored = shipped_or_trained(neusight_dir, {}, progress=False)
    assert isinstance(model, TileMLPModel) and "committed weights" in scored
    assert model.meta["data_sha256"] == TileMLPModel.load().meta["data_sha256"]


def test_other_data_is_trained_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kernels/nvidia/test/bmm.csv.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        f.write("OPName,Latency,Device,B,M,N,K\nbmm,1.0,NVIDIA L4,1,64,64,64\n")
    fitted = object()
    monkeypatch.setattr(forecast.train, "train_model", lambda *a, **k: fitted)
    model, scored = shipped_or_trained(tmp_path, {}, progress=False)
    assert model is fitted and scored == "trained by this run"


def test_the_command_says_which_model_it_scored(
    neusight_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulator.cli import main

    out = tmp_path / "v.json"
    assert (
        main(["kernels", "validate", "--no-logo", "--data", str(neusight_dir), "--out", str(out)])
        == 0
    )
    assert "unseen GPUs: the committed weights (trained on this data)" in capsys.readouterr().out
    assert json.loads(out.read_text())["unseen_model"].startswith("the committed weights")
