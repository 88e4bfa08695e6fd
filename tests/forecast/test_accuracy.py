"""Accuracy of the committed weights on GPUs absent from training (NeuSight test rows).

The README table comes from forecast/data/weights/validation.json, written by
`tilesim kernels validate` with the same `score` function used here; this test recomputes
the unseen-GPU rows from the committed weights and checks they agree with the file, so the
README cannot drift from what the model does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forecast.dataset import Measurements
from forecast.evaluate import device_rows, neusight_test_rows, score
from forecast.predict import load_latency_model
from forecast.roofline import RooflineModel
from simulator.kernel_commands import VALIDATION_FILE

UNSEEN = ("NVIDIA L4", "NVIDIA A100 80GB PCIe")

pytestmark = pytest.mark.slow


def _unseen_test_rows(neusight_dir: Path, device: str) -> Measurements:
    return device_rows(neusight_test_rows(neusight_dir), device)


@pytest.mark.parametrize("device", UNSEEN)
def test_validation_file_matches_the_committed_weights(neusight_dir: Path, device: str) -> None:
    report = json.loads(VALIDATION_FILE.read_text())["unseen"][device]["tile-mlp"]
    fresh = score(load_latency_model("tile-mlp"), _unseen_test_rows(neusight_dir, device))
    for family, stats in report.items():
        assert fresh[family]["n"] == stats["n"]
        assert fresh[family]["mape_pct"] == pytest.approx(stats["mape_pct"], abs=0.05)


def test_a100_80gb_every_family_beats_roofline_and_gemms_within_10pct(neusight_dir: Path) -> None:
    rows = _unseen_test_rows(neusight_dir, "NVIDIA A100 80GB PCIe")
    ours = score(load_latency_model("tile-mlp"), rows)
    roof = score(RooflineModel(), rows)
    for family in ("bmm", "linear", "elementwise", "softmax", "layernorm"):
        assert ours[family]["mape_pct"] < roof[family]["mape_pct"], family
    assert ours["bmm"]["mape_pct"] <= 10 and ours["linear"]["mape_pct"] <= 10


def test_l4_gemms_beat_roofline(neusight_dir: Path) -> None:
    rows = _unseen_test_rows(neusight_dir, "NVIDIA L4")
    ours = score(load_latency_model("tile-mlp"), rows)
    roof = score(RooflineModel(), rows)
    for family in ("bmm", "linear", "elementwise"):
        assert ours[family]["mape_pct"] < roof[family]["mape_pct"], family
