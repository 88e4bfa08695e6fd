"""Procurement inputs found by a buyer's audit: a price or power of zero or of 1e308, and a
token budget of 1 token or of 1e30, ran to the end (a 1e308 price turned every simulated
layout into an ``error`` row, exit 1 with the folder written; a zero price tied every layout
of its option at $0, ranked by key; 1 token trained in 1e-11 days and 1e30 in 1e19 days).
Each is now one line naming the key, exit 2, nothing written; and the written rows keep
the closed forms the report states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.report import rank
from simulator.scenario import load_scenario
from simulator.space import enumerate_space, find_scenario
from tests.support import error_line

TINY = find_scenario("tiny-gpt-8gpu")  # one step: 16 sequences x 128 tokens = 2,048 tokens
BUDGET = ("--set", "sweep.train_tokens=[1e9]")


def _sweep(out: Path, *extra: str) -> int:
    argv = ["sweep", str(TINY), "--serial", "--no-progress", "--out", str(out)]
    return main([*argv, *extra])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("sweep.options=[{price_per_gpu_hour = 0}]", "sweep.options[0].price_per_gpu_hour"),
        ("sweep.options=[{price_per_gpu_hour = 1e308}]", "sweep.options[0].price_per_gpu_hour"),
        ("sweep.options=[{power_w_per_gpu = 0}]", "sweep.options[0].power_w_per_gpu"),
        ("sweep.options=[{power_w_per_gpu = 1e308}]", "sweep.options[0].power_w_per_gpu"),
        ("sweep.train_tokens=[1e30]", "sweep.train_tokens"),
        ("sweep.train_tokens=[1]", "sweep.train_tokens"),
        ("sweep.train_tokens=[2047]", "sweep.train_tokens"),
    ],
)
def test_an_absurd_price_power_or_budget_is_refused_before_any_work(
    tmp_path: Path, override: str, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    price = ("--set", "sweep.options=[{price_per_gpu_hour = 2.0}]")
    extra = (*BUDGET, *price, "--rank", "cost", "--set", override)
    assert _sweep(out, *extra) == 2
    line = error_line(capsys, key, "give")
    assert "1e+308" not in line or "at most" in line
    assert not out.exists()


def test_a_budget_of_one_step_and_the_largest_inputs_are_accepted() -> None:
    sets = (
        "sweep.train_tokens=[2048]",  # exactly one optimizer step
        "sweep.options=[{price_per_gpu_hour = 1e6, power_w_per_gpu = 1e6}]",
    )
    space = enumerate_space(load_scenario(TINY, overrides=sets))
    assert space.train_tokens == 2048
    assert space.contexts[0].price_per_gpu_hour == 1e6


def test_a_budget_under_one_step_names_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"one optimizer step .*2,048 tokens"):
        enumerate_space(load_scenario(TINY, overrides=("sweep.train_tokens=[100]",)))


def test_rows_keep_the_closed_forms_and_rank_cost_picks_the_cheapest(tmp_path: Path) -> None:
    """days = ceil(tokens / tokens per step) x step s / 86400; cost = GPUs x hours x price;
    MWh = GPUs x W x h / 1e6; ``--rank cost`` puts the cheapest fitting simulated layout
    first, ``time`` the fastest."""
    out = tmp_path / "out"
    opts = (
        'sweep.options=[{id = "a", price_per_gpu_hour = 2.0, power_w_per_gpu = 700.0}, '
        '{id = "b", gpu = "h100-sxm5-80gb", server = "dgx-h100", network = "ib-ndr", '
        "price_per_gpu_hour = 9.0, power_w_per_gpu = 1000.0}]"
    )
    assert _sweep(out, *BUDGET, "--set", opts, "--rank", "cost") == 0
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    ok = [r for r in rows if r["tier"] == "simulate" and r["status"] == "ok"]
    assert ok and all(r["fits"] for r in ok)
    for r in ok:
        seconds = 488_282 * r["iteration_s"]  # ceil(1e9 / 2,048) whole steps
        hours = seconds / 3600
        assert r["time_to_train_s"] == pytest.approx(seconds, rel=1e-12)
        assert r["cost_usd"] == pytest.approx(r["num_gpus"] * hours * r["price_per_gpu_hour"])
        assert r["energy_mwh"] == pytest.approx(r["num_gpus"] * r["power_w_per_gpu"] * hours / 1e6)
    assert rank(rows, "cost")[0]["cost_usd"] == min(r["cost_usd"] for r in ok)
    assert rank(rows, "time")[0]["tokens_per_s"] == max(r["tokens_per_s"] for r in ok)
    assert all(r["status"] == "ok" for r in rank(rows, "cost"))


@pytest.mark.parametrize("name", ["h200 | rent", "h200\\nrent", "a\\tb"])
def test_an_option_id_that_would_split_a_report_table_is_refused(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An id holding ``|`` or a newline was written into the procurement table as is: its row
    split into extra columns or two lines."""
    out = tmp_path / "out"
    assert _sweep(out, "--set", f'sweep.options=[{{id = "{name}"}}]') == 2
    error_line(capsys, "sweep.options[0].id", "give one line")
    assert not out.exists()
