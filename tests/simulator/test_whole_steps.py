"""Time to train counts whole optimizer steps: a budget that is not a multiple of the step's
tokens takes one more step (the budget over tokens/s counted a fraction of a last step)."""

from __future__ import annotations

import pytest

from simulator.rows import add_training_cost, blank_row, train_steps


def test_steps_are_the_budget_over_the_step_rounded_up() -> None:
    assert train_steps(1e8, 100_000) == 1000  # a whole number of steps: no extra one
    assert train_steps(1e8 + 1, 100_000) == 1001
    assert train_steps(2e12, 1024 * 8192) == 238_419  # procurement-70b: 238,418.58 steps
    # exact where a float quotient is not: 2^60 / 3 as a float is 22 steps short
    assert train_steps(float(2**60), 3) == -(-(2**60) // 3)


def test_time_cost_and_energy_follow_the_whole_steps() -> None:
    """1e8 + 1 tokens in 1e5-token steps of 2 s on 8 GPUs: 1001 steps, 2002 s."""
    row = blank_row(
        num_gpus=8,
        iteration_s=2.0,
        tokens_per_s=5e4,
        train_tokens=1e8 + 1,
        price_per_gpu_hour=3.0,
        power_w_per_gpu=1000.0,
    )
    add_training_cost(row, tokens_per_step=100_000)
    assert row["time_to_train_s"] == pytest.approx(2002.0, rel=1e-15)
    assert row["cost_usd"] == pytest.approx(8 * 2002.0 / 3600 * 3.0, rel=1e-15)
    assert row["energy_mwh"] == pytest.approx(8 * 2002.0 / 3600 * 1000.0 / 1e6, rel=1e-15)


def test_a_row_without_a_budget_or_a_rate_gets_no_time() -> None:
    for fields in ({"train_tokens": None}, {"tokens_per_s": None, "iteration_s": None}):
        row = blank_row(num_gpus=8, iteration_s=1.0, tokens_per_s=1e5, train_tokens=1e8)
        row.update(fields)
        add_training_cost(row, tokens_per_step=100_000)
        assert row["time_to_train_s"] is None and row["cost_usd"] is None
