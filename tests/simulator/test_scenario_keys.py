"""The scenario-key reference: generated from the validating models, and the docs match it."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.parallel import RunConfig
from simulator.scenario import load_scenario, resolve
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


def test_file_paths_in_a_scenario_are_relative_to_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cluster.gpu = "mygpu.toml" was read from the current folder (model.hf_config from the
    scenario's); a base_dir key in the file was silently dropped."""

    root = Path(__file__).resolve().parents[2]
    text = (root / "scenarios" / "tiny_gpt_8gpu.toml").read_text()
    gpu = (root / "forecast" / "data" / "gpus" / "a100-sxm4-80gb.toml").read_text()
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "mygpu.toml").write_text(gpu.replace("A100", "Mine"))
    lines = ['gpu = "mygpu.toml"' if ln.startswith("gpu =") else ln for ln in text.splitlines()]
    scenario = tmp_path / "study" / "s.toml"
    scenario.write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)  # not the scenario's folder
    assert "Mine" in resolve(load_scenario(scenario)).gpu.name
    (tmp_path / "b.toml").write_text('base_dir = "/elsewhere"\n' + text)
    with pytest.raises(ConfigError, match="key 'base_dir': not a scenario key"):
        load_scenario(tmp_path / "b.toml")
