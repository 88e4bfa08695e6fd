"""The README's validation tables are the output of the commands that generate them, not
hand edits: each table between its markers equals what the code prints now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forecast.report import TABLE_BEGIN, TABLE_END, ReportError, update_readme, validation_markdown
from simulator.kernel_commands import VALIDATION_FILE

ROOT = Path(__file__).resolve().parents[1]
NEUSIGHT = ROOT.parent / "shared" / "data" / "neusight"


def _between(begin: str, end: str) -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index(begin) + len(begin) : text.index(end)].strip()


def test_kernel_table_is_generated_from_validation_json() -> None:
    report = json.loads(VALIDATION_FILE.read_text())
    assert _between(TABLE_BEGIN, TABLE_END) == validation_markdown(report).strip()


def test_e2e_tables_are_what_validate_e2e_prints() -> None:
    if not (NEUSIGHT / "labels").is_dir():
        pytest.skip(f"NeuSight labels not found at {NEUSIGHT} (clone without ../shared)")
    from simulator.e2e_tables import e2e_runs, e2e_tables

    tables = e2e_tables(NEUSIGHT, e2e_runs(NEUSIGHT)[0])
    assert len(tables) == 3
    for t in tables:
        assert _between(t.begin, t.end) == t.markdown


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("a\nEND\nb\nBEGIN\nc\n", "comes before"),
        ("a\nBEGIN\nb\nEND\nBEGIN\nEND\n", "once each"),
        ("a\nb\n", "once each"),
    ],
)
def test_update_readme_refuses_markers_it_would_garble(
    tmp_path: Path, body: str, needle: str
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(body)
    with pytest.raises(ReportError, match=needle):
        update_readme(readme, "TABLE", begin="BEGIN", end="END")
    assert readme.read_text() == body  # untouched


def test_update_readme_replaces_only_between_the_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("a\nBEGIN\nold\nEND\nb\n")
    update_readme(readme, "TABLE", begin="BEGIN", end="END")
    assert readme.read_text() == "a\nBEGIN\nTABLE\nEND\nb\n"
