"""Another vendor as unseen test data: every AMD row of the NeuSight folder (train/ and test/,
none ever trained on) is scored per device, tile-mlp against roofline; the kernel table shows
those rows after the unseen NVIDIA GPUs and still prints reports written before the section."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from forecast.dataset import DataError
from forecast.evaluate import unseen_vendor_errors, validate
from forecast.gpus import GPUSpec
from forecast.kernels import KernelSpec
from forecast.predict import load_latency_model
from forecast.report import validation_markdown
from simulator.cli import main
from simulator.kernel_commands import VALIDATION_FILE

MI100, MI210 = "AMD Instinct MI100", "AMD Instinct MI210"
GEMM_HEAD = "OPName,Latency,Device,B,M,N,K\n"
ROW_HEAD = "OPName,Latency,Device,B,H\n"


class _OneMs:
    """A latency model that forecasts every kernel at 1 ms."""

    name = "one-ms"

    def predict_s(self, kernels: list[KernelSpec], gpu: GPUSpec) -> np.ndarray:
        return np.full(len(kernels), 1e-3)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


def _folder(root: Path, *, amd: bool = True) -> Path:
    """A NeuSight-shaped folder: an L4 bmm test row, and (``amd``) AMD rows in test/ and
    train/<op>/ plus a train_merged/ row, which only repeats train/ rows upstream."""
    _write(root / "kernels/nvidia/test/bmm.csv.gz", GEMM_HEAD + "bmm,1.0,NVIDIA L4,1,64,64,64\n")
    if not amd:
        return root
    # 1 ms and 0.5 ms measured, 1 ms forecast: errors 0% and 100%
    rows = f"bmm,1.0,{MI100},1,64,64,64\nbmm,0.5,{MI100},1,64,64,128\nbmm,0.5,{MI210},1,64,64,64\n"
    _write(root / "kernels/amd/test/bmm.csv.gz", GEMM_HEAD + rows)
    gelu = root / "kernels/amd/train/gelu"
    _write(gelu / "AMD_Instinct_MI100.csv.gz", ROW_HEAD + f"gelu,0.5,{MI100},64,1024\n")
    _write(gelu / "AMD_Instinct_MI210.csv.gz", ROW_HEAD + f"gelu,1.0,{MI210},64,1024\n")
    merged = ROW_HEAD + f"gelu,0.25,{MI100},64,1024\n"
    _write(root / "kernels/amd/train_merged/elem.csv.gz", merged)
    return root


def test_every_amd_row_is_scored_per_device_and_nothing_else(tmp_path: Path) -> None:
    errors = unseen_vendor_errors(_OneMs(), _folder(tmp_path))  # type: ignore[arg-type]
    assert list(errors) == [MI100, MI210]  # the L4's NVIDIA row is not in this section
    mi100 = errors[MI100]["tile-mlp"]
    assert set(mi100) == {"bmm", "elementwise"}
    assert mi100["bmm"]["n"] == 2 and mi100["bmm"]["mape_pct"] == pytest.approx(50.0)
    # the train/ row only (0.5 ms: 100%), not train_merged/'s repeat of it
    assert mi100["elementwise"]["n"] == 1 and mi100["elementwise"]["mape_pct"] == pytest.approx(100)
    mi210 = errors[MI210]["tile-mlp"]
    assert mi210["bmm"]["mape_pct"] == pytest.approx(100.0)
    assert mi210["elementwise"]["mape_pct"] == pytest.approx(0.0)
    assert set(errors[MI210]["roofline"]) == {"bmm", "elementwise"}


def test_a_data_folder_without_amd_gives_an_empty_section(tmp_path: Path) -> None:
    """A user's older copy of the data (kernels/nvidia only) is no error."""
    errors = unseen_vendor_errors(_OneMs(), _folder(tmp_path, amd=False))  # type: ignore[arg-type]
    assert errors == {}


def test_validate_still_needs_the_nvidia_folder(tmp_path: Path) -> None:
    """AMD rows alone are no training data: the NVIDIA error is unchanged."""
    _write(tmp_path / "kernels/amd/test/bmm.csv.gz", GEMM_HEAD + f"bmm,1.0,{MI100},1,8,8,8\n")
    with pytest.raises(DataError, match="no kernels/nvidia folder"):
        validate(tmp_path, logo=False, progress=False)


def _entry(mape: dict[str, float]) -> dict[str, dict[str, dict[str, float]]]:
    """An entry whose roofline MAPE is twice tile-mlp's."""
    roofline = {f: {"n": 1, "mape_pct": 2 * v} for f, v in mape.items()}
    return {"tile-mlp": {f: {"n": 1, "mape_pct": v} for f, v in mape.items()}, "roofline": roofline}


FAMILIES = ("bmm", "linear", "elementwise", "softmax", "layernorm")
OLD = {
    "unseen": {"NVIDIA L4": _entry(dict.fromkeys(FAMILIES, 10.0))},
    "logo": {"Tesla T4": _entry(dict.fromkeys(FAMILIES, 20.0))},
}


def test_amd_rows_come_after_the_unseen_nvidia_gpus() -> None:
    amd = _entry({"bmm": 36.54, "softmax": 27.8})  # no rows of the other families
    table = validation_markdown({**OLD, "unseen_vendor": {MI210: amd, MI100: amd}})
    gpus = [line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()[2:]]
    assert gpus == ["NVIDIA L4", MI100, MI210, "Tesla T4"]
    row = next(line for line in table.splitlines() if MI100 in line)
    assert row == (
        f"| {MI100} | unseen vendor (trained on 5 NVIDIA GPUs) | **36.5** / 73.1 | – | – "
        "| **27.8** / 55.6 | – |"
    )


@pytest.mark.parametrize("section", [None, {}])
def test_a_report_without_amd_rows_prints_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: dict[str, object] | None
) -> None:
    """validation.json written before the section (no key), or from a folder without AMD."""
    report = OLD if section is None else {**OLD, "unseen_vendor": section}
    (tmp_path / "v.json").write_text(json.dumps(report))
    assert main(["kernels", "table", "--report", str(tmp_path / "v.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5  # caption, head, rule, the L4, the T4
    assert lines[3].startswith("| NVIDIA L4 | unseen (trained on 5 GPUs) | **10.0** / 20.0 |")
    assert lines[4].startswith("| Tesla T4 | leave-one-GPU-out | **20.0** / 40.0 |")


@pytest.mark.slow
def test_validation_file_amd_section_matches_the_committed_weights(neusight_dir: Path) -> None:
    """The committed section is what the committed weights (the all-five model) score now."""
    if not (neusight_dir / "kernels" / "amd").is_dir():
        pytest.skip(f"NeuSight AMD kernels not found at {neusight_dir / 'kernels' / 'amd'}")
    report = json.loads(VALIDATION_FILE.read_text())["unseen_vendor"]
    fresh = unseen_vendor_errors(load_latency_model("tile-mlp"), neusight_dir)
    assert list(fresh) == [MI100, MI210] == sorted(report)
    for device, entry in report.items():
        for model, families in entry.items():
            for family, stats in families.items():
                got = fresh[device][model][family]
                assert got["n"] == stats["n"]
                assert got["mape_pct"] == pytest.approx(stats["mape_pct"], abs=0.05)


def test_validate_scores_the_vendor_with_its_unseen_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`validate` fills ``unseen_vendor`` from the model it scores the unseen NVIDIA GPUs with
    (trained once on all five), not from a leave-one-GPU-out fold."""
    import forecast.train

    trained: list[object] = []

    def fake_train(*args: object, **kwargs: object) -> _OneMs:
        trained.append(kwargs.get("devices"))
        return _OneMs()

    monkeypatch.setattr(forecast.train, "train_model", fake_train)
    monkeypatch.setattr(forecast.train, "load_family_data", lambda *a, **k: {})
    folder = _folder(tmp_path)
    report = validate(folder, logo=False, progress=False)
    assert trained == [None]  # one fit, on the default (all five) training GPUs
    assert list(report["unseen"]) == ["NVIDIA L4"]
    assert report["unseen_vendor"] == unseen_vendor_errors(_OneMs(), folder)  # type: ignore[arg-type]
