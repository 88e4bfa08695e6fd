"""Ready-made studies: one TOML file per scenario, plus lookup by id; no logic of their own.

A scenario's id is its file stem with ``_`` written as ``-`` (``gpt3_175b_h100.toml`` ->
``gpt3-175b-h100``); the exact stem works too. The schema is `simulator.scenario.Scenario`.
"""

from __future__ import annotations

from pathlib import Path

from simulator.errors import ConfigError
from simulator.scenario import Scenario, load_scenario

SCENARIO_DIR = Path(__file__).resolve().parent


def list_scenarios() -> list[str]:
    """Ids of the shipped scenarios, sorted."""
    return sorted(p.stem.replace("_", "-") for p in SCENARIO_DIR.glob("*.toml"))


def scenario_path(name: str) -> Path:
    """The shipped file of a scenario id (or exact stem)."""
    for path in sorted(SCENARIO_DIR.glob("*.toml")):
        if name in (path.stem, path.stem.replace("_", "-")):
            return path
    raise ConfigError(f"scenario {name!r}: unknown id; shipped: {', '.join(list_scenarios())}")


def load(name: str, *, overrides: tuple[str, ...] = ()) -> Scenario:
    """Load a shipped scenario by id."""
    return load_scenario(scenario_path(name), overrides=overrides)
