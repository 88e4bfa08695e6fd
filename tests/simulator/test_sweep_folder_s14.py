"""A sweep folder reused by another scenario holds only the new sweep's results: its rows,
report and figures, never the old sweep's beside the new log (found by a user-path hunt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator import sweep_commands
from simulator.cli import main
from simulator.space import find_scenario
from simulator.sweep_folder import FIGURE_FILES, RESULTS

TINY = find_scenario("tiny-gpt-8gpu")
ARGV = ["sweep", str(TINY), "--serial", "--no-progress"]
NO_FIT = ("--set", "model.vocab_size=1099511627776")  # 2^40 tokens: no layout fits


def _sweep(out: Path, *extra: str) -> int:
    return main([*ARGV, "--out", str(out), *extra])


def test_a_sweep_where_nothing_fits_leaves_no_figure_of_an_earlier_sweep(tmp_path: Path) -> None:
    """The figures of the scenario swept first stayed in the folder, and the second sweep's
    report (no layout fits, so no figure drawn) linked them as its own."""
    assert _sweep(tmp_path) == 0
    assert all((tmp_path / f).is_file() for f in FIGURE_FILES)
    assert _sweep(tmp_path, *NO_FIT) == 1
    assert not any((tmp_path / f).exists() for f in FIGURE_FILES)
    report = (tmp_path / "report.md").read_text()
    assert "no layout fits" in report and ".png" not in report


def test_an_interrupted_sweep_of_another_scenario_keeps_no_old_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in a sweep of another scenario into a used folder left the first scenario's
    rows.jsonl, report and figures beside the new scenario.resolved.json, and `tilesim plot`
    redrew the old rows as if they were the new sweep's."""
    assert _sweep(tmp_path) == 0

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_commands, "run_sweep", interrupted)
    assert _sweep(tmp_path, "--set", "training.global_batch_size=32") == 130
    assert not any((tmp_path / name).exists() for name in RESULTS)
    resolved = json.loads((tmp_path / "scenario.resolved.json").read_text())
    assert resolved["scenario"]["training"]["global_batch_size"] == 32


def test_a_resumed_sweep_keeps_its_own_results_until_it_replaces_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun of the same scenario (a resume) must not throw away its finished results."""
    assert _sweep(tmp_path) == 0
    before = {name: (tmp_path / name).read_bytes() for name in ("rows.jsonl", "report.md")}

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_commands, "run_sweep", interrupted)
    assert _sweep(tmp_path, "--candidates", "60") == 130
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
