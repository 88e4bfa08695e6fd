"""Interruptions, checkpoints and restarts (`simulator.reliability`, the ``[reliability]``
table): Daly's expected wall time against its limits, Young's interval, an independent Monte
Carlo run of the process it models, and a procurement sweep's rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from forecast.kernels import Dtype
from simulator.cli import main
from simulator.errors import ConfigError
from simulator.memory import checkpoint_bytes
from simulator.reliability import Checkpointing, optimal_interval_s, run_with_failures
from simulator.rows import add_training_cost, blank_row
from simulator.scenario import load_scenario
from simulator.space import enumerate_space, find_scenario
from tests.support import error_line

TINY = find_scenario("tiny-gpt-8gpu")  # one step: 16 sequences x 128 tokens = 2,048 tokens
HOUR = 3600.0


def test_a_cluster_that_never_fails_trains_at_the_checkpoints_cost_alone() -> None:
    """M -> infinity with a fixed interval: T = W (tau + delta) / tau."""
    c = Checkpointing(mtbf_s=1e15, checkpoint_s=60.0, restart_s=600.0, interval_s=3600.0)
    run = run_with_failures(36_000.0, c)
    assert run.wall_s == pytest.approx(36_000.0 * 3660.0 / 3600.0, rel=1e-6)
    assert run.goodput == pytest.approx(3600.0 / 3660.0, rel=1e-6)


def test_free_checkpoints_taken_continuously_lose_only_the_restarts() -> None:
    """delta = 0: the optimum is tau -> 0 and T = W e^(R/M) (each interruption costs a
    restart, itself interruptible)."""
    c = Checkpointing(mtbf_s=10 * HOUR, checkpoint_s=0.0, restart_s=HOUR)
    run = run_with_failures(100 * HOUR, c)
    assert run.interval_s == 0.0
    assert run.wall_s == pytest.approx(100 * HOUR * math.exp(0.1), rel=1e-12)


@pytest.mark.parametrize("mtbf_h", [1.0, 10.0, 1000.0])
def test_the_interval_minimises_the_expected_time_and_is_young_s_to_first_order(
    mtbf_h: float,
) -> None:
    m, delta = mtbf_h * HOUR, 30.0
    tau = optimal_interval_s(delta, m)
    c = Checkpointing(mtbf_s=m, checkpoint_s=delta, restart_s=120.0)
    best = run_with_failures(1e9, c).wall_s
    for scale in (0.9, 0.99, 1.01, 1.1):
        other = run_with_failures(1e9, Checkpointing(m, delta, 120.0, interval_s=scale * tau))
        assert other.wall_s > best
    young = math.sqrt(2 * delta * m)
    assert tau == pytest.approx(young, rel=2 * math.sqrt(delta / (2 * m)) + 0.02)


def test_daly_s_formula_is_the_mean_of_simulated_runs() -> None:
    """An independent check: 4,000 runs of the modelled process (exponential interruptions;
    a segment of work and its checkpoint rerun until one pass has no interruption; a restart
    interrupted starts over), seeded; their mean is within 2% of the formula."""
    m, delta, restart, tau, work = 5.0, 0.5, 1.0, 2.0, 40.0
    rng = np.random.default_rng(0)
    walls = []
    for _ in range(4000):
        t = 0.0
        for _seg in range(int(work / tau)):
            while True:
                fail = rng.exponential(m)
                if fail >= tau + delta:
                    t += tau + delta
                    break
                t += fail
                while True:  # the restart, until one completes
                    fail = rng.exponential(m)
                    if fail >= restart:
                        t += restart
                        break
                    t += fail
        walls.append(t)
    expected = run_with_failures(work, Checkpointing(m, delta, restart, interval_s=tau)).wall_s
    assert np.mean(walls) == pytest.approx(expected, rel=0.02)
    assert expected > 1.9 * work  # the case is far from the failure-free limit


def test_a_run_shorter_than_the_interval_writes_one_checkpoint() -> None:
    c = Checkpointing(mtbf_s=1e6, checkpoint_s=60.0, restart_s=0.0)
    run = run_with_failures(100.0, c)
    assert run.interval_s == 100.0
    assert run.wall_s == pytest.approx(1e6 * math.expm1(160.0 / 1e6), rel=1e-12)


def test_a_run_that_never_completes_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"never completes.*gpu_mtbf_hours"):
        run_with_failures(1e6, Checkpointing(mtbf_s=1.0, checkpoint_s=1000.0, restart_s=0.0))


def test_a_checkpoint_holds_weights_master_copy_and_adam_moments() -> None:
    assert checkpoint_bytes(1e9, Dtype.BF16) == 1e9 * (2 + 4 + 8)
    assert checkpoint_bytes(1e9, Dtype.FP8) == 1e9 * (2 + 4 + 8)  # fp8 keeps 16-bit weights
    assert checkpoint_bytes(1e9, Dtype.FP32) == 1e9 * (4 + 8)


def test_rows_pay_for_the_expected_wall_time() -> None:
    c = Checkpointing(mtbf_s=2 * HOUR, checkpoint_s=60.0, restart_s=600.0)
    row = blank_row(iteration_s=10.0, tokens_per_s=1.0, train_tokens=1e6, num_gpus=8)
    row["price_per_gpu_hour"], row["power_w_per_gpu"] = 2.0, 1000.0
    add_training_cost(row, tokens_per_step=1000, checkpointing=c)  # 1,000 steps of 10 s
    run = run_with_failures(10_000.0, c)
    assert row["time_to_train_s"] == run.wall_s
    assert row["goodput"] == pytest.approx(10_000.0 / run.wall_s)
    assert row["checkpoint_s"] == 60.0 and row["checkpoint_interval_s"] == run.interval_s
    assert row["cost_usd"] == pytest.approx(run.wall_s / HOUR * 8 * 2.0)
    assert row["energy_mwh"] == pytest.approx(run.wall_s / HOUR * 8 * 1000.0 / 1e6)


RELIABLE = (
    "reliability.gpu_mtbf_hours=5000",
    "reliability.restart_s=600",
    "reliability.checkpoint_s=60",
)


def test_an_option_s_mtbf_and_the_write_bandwidth_reach_each_context() -> None:
    sets = (
        *RELIABLE[:2],
        "reliability.checkpoint_write_bytes_per_s=1e9",
        "sweep.train_tokens=[1e9]",
        "sweep.world_size=[4, 8]",
        'sweep.options=[{id = "a"}, {id = "b", gpu_mtbf_hours = 100}]',
    )
    space = enumerate_space(load_scenario(TINY, overrides=sets))
    by_id = {c.id: c.checkpointing for c in space.contexts}
    assert by_id["a@4"].mtbf_s == 5000 * HOUR / 4
    assert by_id["a@8"].mtbf_s == 5000 * HOUR / 8
    assert by_id["b@8"].mtbf_s == 100 * HOUR / 8
    params = space.contexts[0].inputs.model.num_params()
    dtype = space.contexts[0].inputs.dtype
    assert by_id["a@4"].checkpoint_s == checkpoint_bytes(params, dtype) / 1e9


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (RELIABLE[:2], ("neither of checkpoint_s and checkpoint_write_bytes_per_s",)),
        ((*RELIABLE, "reliability.checkpoint_write_bytes_per_s=1e9"), ("both of",)),
        (("reliability.restart_s=1", "reliability.checkpoint_s=1"), ("gpu_mtbf_hours",)),
        ((*RELIABLE, "reliability.restart_s=-1"), ("restart_s",)),
        ((*RELIABLE, "reliability.gpu_mtbf_hours=nan"), ("gpu_mtbf_hours",)),
        (("sweep.options=[{gpu_mtbf_hours = 100}]",), ("no [reliability] table",)),
        (
            (
                *RELIABLE,
                "sweep.options=[{gpu_mtbf_hours = 0}]",
            ),
            ("gpu_mtbf_hours", "positive"),
        ),
        ((*RELIABLE, "reliability.gpu_mtbf_hours=1e-6"), ("never completes",)),
    ],
)
def test_bad_reliability_input_is_one_line_before_any_work(
    tmp_path: Path,
    sets: tuple[str, ...],
    words: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    argv = ["sweep", str(TINY), "--serial", "--no-progress", "--out", str(out)]
    for s in ("sweep.train_tokens=[1e9]", *sets):
        argv += ["--set", s]
    assert main(argv) == 2
    error_line(capsys, *words)
    assert not out.exists()


def test_reliability_without_a_token_budget_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table prices the time to train a budget; without one it would change nothing."""
    out = tmp_path / "out"
    argv = ["sweep", str(TINY), "--serial", "--no-progress", "--out", str(out)]
    assert main([*argv, *(x for s in RELIABLE for x in ("--set", s))]) == 2
    error_line(capsys, "reliability", "sweep.train_tokens")
    assert not out.exists()


def test_a_sweep_reports_goodput_and_takes_longer_than_without_failures(tmp_path: Path) -> None:
    budget = ("--set", "sweep.train_tokens=[1e9]")
    base = ["sweep", str(TINY), "--serial", "--no-progress", *budget]
    assert main([*base, "--out", str(tmp_path / "plain")]) == 0
    sets = [x for s in RELIABLE for x in ("--set", s)]
    assert main([*base, *sets, "--out", str(tmp_path / "failing")]) == 0

    def simulated(name: str) -> dict[str, dict[str, object]]:
        lines = (tmp_path / name / "rows.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        return {r["key"]: r for r in rows if r["tier"] == "simulate" and r["time_to_train_s"]}

    plain, failing = simulated("plain"), simulated("failing")
    assert plain and plain.keys() == failing.keys()
    for key, r in failing.items():
        assert plain[key]["goodput"] is None
        n = float(r["num_gpus"])  # type: ignore[arg-type]
        c = Checkpointing(mtbf_s=5000 * HOUR / n, checkpoint_s=60.0, restart_s=600.0)
        expected = run_with_failures(float(plain[key]["time_to_train_s"]), c)  # type: ignore[arg-type]
        assert r["time_to_train_s"] == pytest.approx(expected.wall_s, rel=1e-12)
        assert 0 < r["goodput"] < 1  # type: ignore[operator]
    report = (tmp_path / "failing" / "report.md").read_text()
    assert "goodput" in report
