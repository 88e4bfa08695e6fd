"""What a new user copies from the docs runs as written: the `tilesim` commands that
docs/*.md and the scenario files' comments show parse, the `--set` overrides a scenario's
comment offers load and resolve, the sweep's candidate counts the README gives are the
sweep's defaults, the code names the README's "add a latency model" row points at exist,
and `tilesim predict` prints what the README says its numbers are."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from forecast import predict as forecast_predict
from scenarios import SCENARIO_DIR
from simulator import predict_commands, scenario
from simulator.cli import build_parser, main
from simulator.scenario import load_scenario, resolve
from simulator.sweep_eval import PER_CONTEXT, TOP_CANDIDATES

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _comment_text(path: Path) -> str:
    """The comments of a TOML file, joined (a backticked command may wrap a line)."""
    parts = (line.split("#", 1)[1] for line in path.read_text().splitlines() if "#" in line)
    return " ".join(p.strip() for p in parts)


def _doc_commands() -> list[tuple[str, str]]:
    texts = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
    texts |= {p.name: _comment_text(p) for p in sorted(SCENARIO_DIR.glob("*.toml"))}
    found = []
    for name, text in texts.items():
        for c in re.findall(r"`(tilesim [^`]+)`", text):
            # placeholders (DIR, TABLE.KEY=VALUE, a|b, [--x]) are not commands to run
            if not re.search(r"\b[A-Z]{3,}\b|\[|\||\.\.\.", c) and len(c.split()) >= 3:
                found.append((name, c))
    return sorted(set(found))


def test_docs_and_scenario_comments_show_commands() -> None:
    names = {name for name, _ in _doc_commands()}
    assert "gpt3_175b_h100.toml" in names
    assert "scenario_keys.md" in names


@pytest.mark.parametrize(("source", "command"), _doc_commands())
def test_doc_command_parses(source: str, command: str) -> None:
    build_parser().parse_args(shlex.split(command)[1:])  # argparse exits 2 on a bad flag


def test_gpt3_a100_comment_overrides_load_and_resolve() -> None:
    # the comment's "the paper's 2021 code (--set A --set B --set C)" must be valid input
    path = SCENARIO_DIR / "gpt3_175b_a100.toml"
    overrides = tuple(re.findall(r"--set (\S+?)\)?(?=\s|$)", _comment_text(path)))
    assert len(overrides) == 3
    s = load_scenario(path, overrides=overrides)
    assert s.training.attention == "unfused"
    assert s.run.tp_comm_overlap is False and s.run.pp_blocking_sends is True
    resolve(s)


def test_readme_candidate_counts_are_the_sweep_defaults() -> None:
    text = " ".join(README.split())
    top = re.search(
        r"the (\d+) fitting layouts the screen rates fastest, or cheapest under "
        r"`--rank cost`, `--candidates N`",
        text,
    )
    per = re.search(r"plus the fastest (\d+) of each cluster size and option, `--per-context", text)
    assert top and per, "README: the sweep's candidate sentence moved; update this test"
    assert (int(top[1]), int(per[1])) == (TOP_CANDIDATES, PER_CONTEXT)


def test_readme_add_a_latency_model_names_code_that_exists() -> None:
    row = next(x for x in README.splitlines() if x.startswith("| a latency model |"))
    assert "LATENCY_MODELS" in row and "forecast/predict.py" in row
    assert isinstance(forecast_predict.LATENCY_MODELS, dict)
    assert "WHOLE_MODEL_LATENCY" in row and "simulator/predict_commands.py" in row
    assert set(predict_commands.WHOLE_MODEL_LATENCY) <= set(forecast_predict.LATENCY_MODELS)
    assert "training.latency_model" in row and "simulator/scenario.py" in row
    assert "latency_model" in scenario.TrainingSection.model_fields


def test_predict_e2e_is_forward_plus_backward_with_the_optimizer_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the README: `e2e_ms` is the forward and backward passes, `optimizer_ms` apart
    assert "prints `e2e_ms`, the forward and backward passes" in " ".join(README.split())
    argv = "predict --model tiny-gpt --gpu a100-pcie-80gb --batch 2 --seq 128 --mode train"
    assert main([*argv.split(), "--latency-model", "roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["e2e_ms"] == pytest.approx(out["fw_ms"] + out["bw_ms"], rel=1e-12)
    assert out["optimizer_ms"] > 0
    assert out["e2e_ms"] == pytest.approx(sum(out["by_family_ms"].values()), rel=1e-9)
