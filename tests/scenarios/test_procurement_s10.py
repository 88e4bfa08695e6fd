"""The procurement study audited as a buyer reads it: time to train, cost and energy in closed
form from the rows; under ``--rank cost`` the layouts simulated are the ones the screen rates
cheapest; an option none of whose layouts fits is listed with the reason; the report says what
its days, dollars and MWh are for. Small TOML studies written in tmp_path keep it fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simulator import plots
from simulator.cli import main
from simulator.report import amount_text, procurement_table, rank
from simulator.saved_rows import load_rows
from simulator.scenario_keys import keys_markdown
from tests.support import TOY_GPT_A100

TOKENS = 1.0e9
# a 2-layer toy GPT (as tiny-gpt-8gpu): two options on the same GPU, one 8-GPU option priced
# high, one 4-GPU option priced low, so the fastest layouts and the cheapest ones differ
CHEAP_VS_FAST = (
    '[study]\nname = "cheap-vs-fast"\n'
    + TOY_GPT_A100
    + f"""[sweep]
train_tokens = [{TOKENS}]
tp = [1, 2]
pp = [1, 2]
micro_batch_size = [1, 2]
[[sweep.options]]
id = "fast"
num_gpus = [8]
price_per_gpu_hour = 10.0
power_w_per_gpu = 1000.0
[[sweep.options]]
id = "cheap"
num_gpus = [4]
price_per_gpu_hour = 1.0
power_w_per_gpu = 500.0
"""
)
# 44 layers of width 4096 at tp 2 x pp 2: 43.2 GiB per GPU, which fits an 80 GB A100 and not
# a 40 GB one (40 GiB): the "small" option has no layout that fits
NO_FIT = f"""
[study]
name = "no-fit"
[model]
n_layers = 44
hidden_size = 4096
n_heads = 32
vocab_size = 32000
seq_len = 1024
[cluster]
gpu = "a100-sxm4-80gb"
server = "dgx-a100"
network = "ib-hdr"
num_gpus = 4
[training]
global_batch_size = 8
latency_model = "roofline"
[run]
dp = 0
[sweep]
train_tokens = [{TOKENS}]
tp = [2]
pp = [2]
[[sweep.options]]
id = "big"
price_per_gpu_hour = 2.0
power_w_per_gpu = 1000.0
[[sweep.options]]
id = "small"
gpu = "a100-pcie-40gb"
price_per_gpu_hour = 0.5
power_w_per_gpu = 400.0
"""


def _sweep(tmp_path: Path, text: str, *extra: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(text)
    out = tmp_path / "out"
    argv = ["sweep", str(path), "--serial", "--no-progress", "--out", str(out), *extra]
    assert main(argv) == 0
    return out


def test_time_cost_and_energy_are_the_closed_forms_of_every_ranked_row(tmp_path: Path) -> None:
    rows = load_rows(_sweep(tmp_path, CHEAP_VS_FAST, "--rank", "cost"))
    ranked = rank(rows, "cost")
    assert len(ranked) >= 4
    for r in ranked:
        # the token budget in whole steps of 16 x 128 tokens: ceil(488,281.25)
        seconds = 488_282 * r["iteration_s"]
        gpu_hours = r["num_gpus"] * seconds / 3600.0
        assert r["train_tokens"] == TOKENS
        assert r["time_to_train_s"] == pytest.approx(seconds, rel=1e-12)
        assert r["cost_usd"] == pytest.approx(gpu_hours * r["price_per_gpu_hour"], rel=1e-12)
        # W x h = Wh; 1 MWh = 1e6 Wh
        assert r["energy_mwh"] == pytest.approx(gpu_hours * r["power_w_per_gpu"] / 1e6, rel=1e-12)
    costs = [(r["cost_usd"], r["key"]) for r in ranked]
    assert costs == sorted(costs)  # cheapest first, ties by key


def test_rank_cost_simulates_the_layouts_the_screen_rates_cheapest(tmp_path: Path) -> None:
    """With ``--rank cost`` the candidates were the screen's fastest layouts (all on the
    expensive 8-GPU option), so the cost ranking's top rows were not the cheapest layouts:
    the cheap option had only its ``--per-context`` best simulated."""
    rows = load_rows(_sweep(tmp_path, CHEAP_VS_FAST, "--rank", "cost", "--candidates", "3"))
    fitting = [r for r in rows if r["fits"]]

    def screen_cost(r: dict[str, Any]) -> float:  # GPU-hours x price at the screen's rate
        return TOKENS / r["screen_tokens_per_s"] / 3600 * r["num_gpus"] * r["price_per_gpu_hour"]

    cheapest = sorted(fitting, key=lambda r: (screen_cost(r), r["key"]))[:3]
    assert {r["context"] for r in cheapest} == {"cheap@4"}  # the study does what it says
    assert [r["tier"] for r in cheapest] == ["simulate"] * 3
    assert [r["context"] for r in rank(rows, "cost")[:3]] == ["cheap@4"] * 3


def test_rank_tokens_still_simulates_the_fastest(tmp_path: Path) -> None:
    rows = load_rows(_sweep(tmp_path, CHEAP_VS_FAST, "--candidates", "3", "--per-context", "0"))
    fitting = [r for r in rows if r["fits"]]
    fastest = sorted(fitting, key=lambda r: (-r["screen_tokens_per_s"], r["key"]))[:3]
    assert {r["key"] for r in rows if r["tier"] == "simulate"} == {r["key"] for r in fastest}


def test_an_option_no_layout_of_which_fits_is_listed_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The option vanished from the report's table and from the procurement figure."""
    out = _sweep(tmp_path, NO_FIT, "--rank", "cost")
    rows = load_rows(out)
    small = [r for r in rows if r["option"] == "small"]
    assert small and all(r["status"] == "infeasible" for r in small)
    table = procurement_table(rows, by="cost")
    (line,) = [x for x in table.splitlines() if x.startswith("| small |")]
    assert "| 4 |" in line and "no layout fits" in line
    assert small[0]["reason"] in line  # "stage 0 needs 39.4 GiB > 37.3 GiB"
    assert line in (out / "report.md").read_text()
    assert "| big | 4 | tp2 pp2 dp1" in table

    drawn: list[Any] = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or path)
    plots.plot_procurement(rows, tmp_path / "p.png", by="cost")
    (fig,) = drawn
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["big@4", "small@4"]
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts.count("no layout fits") == len(fig.axes)  # in each panel, not a zero bar


def test_the_report_says_what_its_days_cost_and_energy_are_for(tmp_path: Path) -> None:
    """The report's days, $ and MWh did not name the token budget they are for, nor what the
    energy counts (the scenario's power per GPU, no facility overhead)."""
    report = (_sweep(tmp_path, CHEAP_VS_FAST, "--rank", "cost") / "report.md").read_text()
    assert "1e+09 tokens" in report  # sweep.train_tokens
    assert "GPUs x power_w_per_gpu x time" in report
    assert "GPUs x hours x price_per_gpu_hour" in report


def test_the_scenario_keys_say_the_units_of_price_and_power() -> None:
    """docs/scenario_keys.md named price_per_gpu_hour and power_w_per_gpu without their units
    or what the power covers (GPU board or the whole server's share)."""
    text = keys_markdown()
    assert "US$ per GPU-hour" in text
    assert "watts per GPU" in text and "PUE" in text


def test_the_top_layouts_figure_shows_the_amount_it_is_ranked_by(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranked by cost, its labels showed tokens/s and the bubble only: a reader saw an order
    that the numbers beside it did not explain (4th by cost with the most tokens/s)."""
    rows = load_rows(_sweep(tmp_path, CHEAP_VS_FAST, "--rank", "cost"))
    drawn: list[Any] = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or path)
    for by, col, scale, unit in [
        ("cost", "cost_usd", 1.0, "$"),
        ("time", "time_to_train_s", 1 / 86400, "days"),
    ]:
        plots.plot_top_layouts(rows, tmp_path / "t.png", by=by)
        labels = [t.get_text() for t in drawn.pop().axes[0].get_yticklabels()]
        best = rank(rows, by)[0]
        assert labels[-1].endswith(f", {amount_text(best[col] * scale)} {unit})")  # top bar


def test_a_partly_priced_study_ranked_by_cost_names_the_unpriced_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tilesim plot DIR --rank cost` on a study with one option unpriced drew "Top layouts
    by cost" from the priced options alone: the unpriced one vanished without a word. The
    title now names it and why (as the report's table does)."""
    unpriced = CHEAP_VS_FAST.replace("price_per_gpu_hour = 1.0\n", "")
    rows = load_rows(_sweep(tmp_path, unpriced))  # ranked by tokens: no price needed
    drawn: list[Any] = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or path)
    plots.plot_top_layouts(rows, tmp_path / "t.png", by="cost")
    title = drawn.pop().axes[0].get_title()
    assert title.endswith("\ncheap not ranked: no price_per_gpu_hour")
    assert {r["option"] for r in rank(rows, "cost")} == {"fast"}
    plots.plot_top_layouts(rows, tmp_path / "t.png", by="tokens")
    assert "not ranked" not in drawn.pop().axes[0].get_title()
