"""The scenario-key reference: generated from the validating models, and the docs match it."""

from __future__ import annotations

from pathlib import Path

from simulator.parallel import RunConfig
from simulator.scenario_keys import SECTIONS, keys_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "scenario_keys.md"


def test_every_key_has_a_meaning() -> None:
    missing = [
        f"{n}.{k}" for n, m in SECTIONS for k, f in m.model_fields.items() if not f.description
    ]
    assert not missing


def test_reference_lists_every_run_key_with_its_default() -> None:
    text = keys_markdown()
    for key in RunConfig.model_fields:
        assert f"| `{key}` |" in text
    assert '| `schedule` | gpipe \\| 1f1b \\| 1f1b-interleaved | "1f1b" |' in text


def test_docs_file_is_the_generated_reference() -> None:
    assert DOC.read_text() == keys_markdown(), "run `tilesim list keys > docs/scenario_keys.md`"
