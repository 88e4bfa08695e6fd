"""``tilesim plot DIR`` redraws a sweep's figures as the sweep drew them, also from a folder
without scenario.resolved.json (copied without it): the study's name, the ranking and the
number of top layouts come from report.md; with neither file the titles say the study is
unknown. The top-layouts figure shows as many layouts as the report's table (``--top``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from matplotlib.figure import Figure

import simulator.plots as plots
from simulator.cli import main
from simulator.plot_commands import UNKNOWN_STUDY
from simulator.space import find_scenario
from simulator.sweep_folder import sweep_rank, sweep_study, sweep_top
from tests.support import drawn, simulated_row

TINY = find_scenario("tiny-gpt-8gpu")  # 48 simulated layouts


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny-gpt-8gpu sweep ranked by time (a token budget) showing its top 3."""
    out = tmp_path_factory.mktemp("sweep") / "out"
    argv = ["sweep", str(TINY), "--serial", "--no-progress", "--out", str(out)]
    budget = ("--set", "sweep.train_tokens=[1e9]", "--rank", "time", "--top", "3")
    assert main([*argv, *budget]) == 0
    return out


def _copy(swept: Path, tmp_path: Path, *keep: str) -> Path:
    folder = tmp_path / "copy"
    folder.mkdir()
    for name in ("rows.jsonl", *keep):
        shutil.copy(swept / name, folder / name)
    return folder


def _titles(figures: list[Figure]) -> list[str]:
    """Each figure's title: its axes' (the procurement figure's is over all its panels)."""
    return [f.axes[0].get_title() or f.get_suptitle() for f in figures]


def _bars(fig: Figure) -> int:
    return len(fig.axes[0].get_yticklabels())


def test_the_sweep_records_its_study_ranking_and_top(swept: Path) -> None:
    doc = json.loads((swept / "scenario.resolved.json").read_text())
    assert (doc["rank"], doc["top"]) == ("time", 3)
    assert (sweep_study(swept), sweep_rank(swept), sweep_top(swept)) == ("tiny-gpt-8gpu", "time", 3)


def test_report_md_stands_in_for_scenario_resolved_json(swept: Path, tmp_path: Path) -> None:
    folder = _copy(swept, tmp_path, "report.md")
    assert (sweep_study(folder), sweep_rank(folder), sweep_top(folder)) == (
        "tiny-gpt-8gpu",
        "time",
        3,
    )


def test_a_folder_of_rows_alone_has_no_study_tokens_ranking_and_ten(tmp_path: Path) -> None:
    assert (sweep_study(tmp_path), sweep_rank(tmp_path), sweep_top(tmp_path)) == ("", "tokens", 10)


def test_redraw_from_report_md_titles_the_study_and_shows_the_reports_top(
    swept: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _copy(swept, tmp_path, "report.md")
    kept = drawn(monkeypatch, plots)
    assert main(["plot", str(folder)]) == 0
    assert len(kept) == len(plots.PLOTS)
    assert all(t.startswith("tiny-gpt-8gpu on ") for t in _titles(kept))
    assert "Top 3 layouts by time to train" in _titles(kept)[0]
    assert _bars(kept[0]) == 3


def test_redraw_of_rows_alone_says_the_study_is_unknown(
    swept: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The titles named only the hardware, as if the figures were of no study."""
    folder = _copy(swept, tmp_path)
    kept = drawn(monkeypatch, plots)
    assert main(["plot", str(folder), "--top", "5"]) == 0
    assert all(t.startswith(f"{UNKNOWN_STUDY} on ") for t in _titles(kept))
    assert "no scenario.resolved.json or report.md" in capsys.readouterr().err
    assert _bars(kept[0]) == 5  # --top overrides; ranked by tokens/s, the only ranking known


def test_the_figure_shows_as_many_layouts_as_the_report_by_default(
    swept: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The figure drew 12 layouts beside the report's table of 10."""
    rows = [simulated_row("a", 8, 1e5 + i, f"k{i}", **_EXPOSED) for i in range(30)]
    kept = drawn(monkeypatch, plots)
    plots.plot_all(rows, Path("unused"))
    assert _bars(kept[0]) == 10
    report_heading = (swept / "report.md").read_text().splitlines()
    assert "## Top 3" in report_heading
    assert main(["plot", str(swept)]) == 0
    assert _bars(kept[-len(plots.PLOTS)]) == 3


def test_a_top_beyond_the_figures_most_is_said_in_its_title(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [simulated_row("a", 8, 1e5 + i, f"k{i}", **_EXPOSED) for i in range(60)]
    kept = drawn(monkeypatch, plots)
    plots.plot_top_layouts(rows, Path("unused.png"), k=100)
    assert _bars(kept[0]) == plots.MAX_BARS
    assert f"the report lists 60, a figure at most {plots.MAX_BARS}" in _titles(kept)[0]


_EXPOSED = {f"exposed_{k}_s": 0.0 for k in ("tp", "cp", "ep", "pp", "dp")} | {"optimizer_s": 0.1}
