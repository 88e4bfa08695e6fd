"""What a new user reads first agrees with the code: docs/architecture.md names every module
that exists and no other, the hand-written [sweep] part of docs/scenario_keys.md names every
key the sweep accepts and no other, the README's `tilesim ...` commands parse, and the
shipped scenarios mark their user-supplied prices and power as illustrative."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from scenarios import SCENARIO_DIR, list_scenarios, load
from simulator.cli import build_parser
from simulator.rows import RUN_KEYS
from simulator.scenario import Scenario, resolve_model
from simulator.sweep_table import OPTION_KEYS, SWEEP_KEYS

ROOT = Path(__file__).resolve().parents[2]
ARCH = ROOT / "docs" / "architecture.md"
KEYS_DOC = ROOT / "docs" / "scenario_keys.md"
PACKAGES = ("forecast", "topologies", "simulator")


def _sections(text: str, level: str) -> dict[str, str]:
    """Heading text -> body, for the headings of one level (``## ``)."""
    parts = re.split(rf"^{level} (.+)$", text, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _named_modules(body: str) -> set[str]:
    return set(re.findall(r"`([\w*]+\.py)`", body))


@pytest.mark.parametrize("package", PACKAGES)
def test_architecture_names_every_module_of_a_package(package: str) -> None:
    sections = _sections(ARCH.read_text(), "##")
    (body,) = [b for h, b in sections.items() if h.startswith(f"{package}/")]
    named = _named_modules(body)
    files = {p.name for p in (ROOT / package).glob("*.py") if p.name != "__init__.py"}
    undocumented = {f for f in files if not any(Path(f).match(n) for n in named)}
    assert not undocumented, f"docs/architecture.md, {package}/: add {sorted(undocumented)}"
    missing = {n for n in named if not any(Path(f).match(n) for f in files)}
    assert not missing, f"docs/architecture.md names {sorted(missing)}, not in {package}/"


def test_sweep_text_names_every_sweep_and_option_key_and_no_other() -> None:
    body = _sections(KEYS_DOC.read_text(), "##")["[sweep]"]
    # a backticked name, or the first name of `train_tokens = [N]`, `[[sweep.options]]`
    named = set(re.findall(r"`(?:\[\[sweep\.)?([a-z_]+)", body))
    named -= {"tilesim", "cluster", "run"}  # `tilesim simulate`, `cluster.num_gpus`, `run.tp=8`
    accepted = SWEEP_KEYS | OPTION_KEYS
    assert accepted - named == set(), "docs/scenario_keys.md [sweep] misses keys"
    assert named - accepted == set(), "docs/scenario_keys.md [sweep] names keys the code rejects"
    assert set(RUN_KEYS) <= named


def test_keys_doc_has_a_section_per_scenario_table() -> None:
    headings = set(_sections(KEYS_DOC.read_text(), "##"))
    tables = {f"[{k}]" for k in Scenario.model_fields if k != "base_dir"}
    assert headings == tables


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    found = re.findall(r"`(tilesim [^`]+)`", text)
    # placeholders (DIR, CSV..., [--data DIR], a|b) are not commands to run as written, nor
    # a bare `tilesim sweep` a command at all
    runnable = (c for c in found if not re.search(r"\b[A-Z]{3,}\b(?!\.)|\[|\||\.\.\.", c))
    return sorted({c for c in runnable if len(c.split()) >= 3})


def test_readme_finds_its_commands() -> None:
    commands = _readme_commands()
    assert "tilesim sweep procurement-70b --rank cost" in commands
    assert len(commands) >= 10


@pytest.mark.parametrize("command", _readme_commands())
def test_readme_command_parses(command: str) -> None:
    argv = shlex.split(command)[1:]
    build_parser().parse_args(argv)  # argparse exits 2 on an unknown flag or choice


def test_readme_lists_the_shipped_scenarios() -> None:
    text = (ROOT / "README.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("scenarios/"))
    assert line.split(":", 1)[1].split() == [f"{s}," for s in list_scenarios()[:-1]] + [
        list_scenarios()[-1]
    ]


def test_user_supplied_prices_and_power_are_marked_illustrative() -> None:
    for path in sorted(SCENARIO_DIR.glob("*.toml")):
        for line in path.read_text().splitlines():
            if re.match(r"\s*(price_per_gpu_hour|power_w_per_gpu)\s*=", line):
                assert "illustrative" in line, f"{path.name}: {line.strip()}"


def test_every_scenario_opens_with_a_comment_saying_what_it_is() -> None:
    for path in sorted(SCENARIO_DIR.glob("*.toml")):
        assert path.read_text().startswith("# "), path.name


@pytest.mark.parametrize("sid", ["gpt3-175b-a100", "gpt3-175b-h100"])
def test_gpt3_scenarios_are_gpt3_175b(sid: str) -> None:
    # 12 L h^2 (+13 L h biases and norms) + (V + s) h word and position embeddings: 174.6B
    # with the vocabulary padded to 51200, the size Narayanan et al.'s Table 2 gives
    model = resolve_model(load(sid))
    layers, h, v, s = 96, 12288, 51200, 2048
    closed_form = 12 * layers * h * h + 13 * layers * h + (v + s) * h
    assert model.num_params() == pytest.approx(closed_form, rel=1e-3)
    assert model.num_params() == pytest.approx(174.6e9, rel=2e-3)


def _answers_table_commands() -> list[str]:
    """The example command of each row of the README's "What it answers" table."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## What it answers", 1)[1].split("\n\n", 2)[1]
    rows = [line.split(" | ")[1] for line in table.splitlines()[2:]]
    return [re.findall(r"`(tilesim [^`]+)`", cell)[0] for cell in rows]


@pytest.mark.parametrize(
    "command", [c for c in _answers_table_commands() if not c.startswith("tilesim sweep")]
)
def test_the_answers_table_examples_run_and_succeed(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its predict example was a Llama 3 8B training step that does not fit in the GPU
    (exit 1) for weeks; each example now runs and exits 0 (the sweeps are run elsewhere)."""
    from simulator.cli import main

    argv = shlex.split(command)[1:]
    argv = [str(ROOT / a) if a.startswith("scenarios/") else a for a in argv]
    monkeypatch.chdir(tmp_path)  # --trace step.json writes here
    assert main(argv) == 0, command
