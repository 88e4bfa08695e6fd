"""Sweep input checks found by a user-path hunt: each bad input is one line and exit 2 before
any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.space import enumerate_space, find_scenario

TINY = find_scenario("tiny-gpt-8gpu")
ARGV = ["sweep", str(TINY), "--serial", "--no-progress"]


def _sweep(out: Path | str, *extra: str) -> int:
    return main([*ARGV, "--out", str(out), *extra])


def _one_line_error(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tilesim: error: "), err
    assert all(n in lines[0] for n in needles), err
    return lines[0]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ('sweep.tp=["2"]', "sweep.tp"),
        ("sweep.tp=[2.0]", "sweep.tp"),
        ("sweep.zero_stage=[true]", "sweep.zero_stage"),
        ('sweep.sequence_parallel=["false"]', "sweep.sequence_parallel"),
        ("sweep.sequence_parallel=[1]", "sweep.sequence_parallel"),
        ('sweep.distributed_optimizer=["yes"]', "sweep.distributed_optimizer"),
    ],
)
def test_a_wrong_typed_sweep_value_is_refused_by_key(
    tmp_path: Path, override: str, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """These used to pass a lax check and crash (TypeError, ValueError) or label rows zTrue."""
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        enumerate_space(load_scenario(TINY, overrides=(override,)))
    assert _sweep(tmp_path / "out", "--set", override) == 2
    _one_line_error(capsys, key)
    assert not (tmp_path / "out").exists()


def test_swept_values_are_the_validated_values() -> None:
    space = enumerate_space(load_scenario(TINY, overrides=("sweep.zero_stage=[0, 1]",)))
    assert {type(p.zero_stage) for p in space.points} == {int}
    assert {type(p.sequence_parallel) for p in space.points} == {bool}


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("sweep.train_tokens=[nan]", "sweep.train_tokens"),
        ("sweep.train_tokens=[inf]", "sweep.train_tokens"),
        ("sweep.options=[{price_per_gpu_hour = nan}]", "sweep.options[0].price_per_gpu_hour"),
        ("sweep.options=[{power_w_per_gpu = inf}]", "sweep.options[0].power_w_per_gpu"),
    ],
)
def test_a_non_finite_number_is_refused_before_any_work(
    tmp_path: Path, override: str, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN passed the ``< 0`` checks; the sweep then ran and crashed in plotting, half-written."""
    out = tmp_path / "out"
    extra = ("--set", "sweep.train_tokens=[1e9]", "--rank", "cost")
    assert _sweep(out, *extra, "--set", override) == 2
    _one_line_error(capsys, key, "finite")
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "key"),
    [
        ('{id="a", gpus_per_node=0}', "sweep.options[0].gpus_per_node"),  # ZeroDivisionError
        ('{id="a", network=5}', "sweep.options[0].network"),  # TypeError
        ('{id="a", nics_per_node=-1}', "sweep.options[0].nics_per_node"),  # Infinity rows
        ('{id="a", gpu="no-such-gpu"}', "sweep.options[0] (a, 4 GPUs): cluster"),
        ('{id=""}', "sweep.options[0].id"),
    ],
)
def test_option_cluster_keys_follow_the_cluster_rules(
    tmp_path: Path, option: str, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _sweep(out, "--set", f"sweep.options=[{option}]") == 2
    _one_line_error(capsys, key)
    assert not out.exists()


DUPLICATE_IDS = """
[[sweep.options]]
id = "x"
gpu = "a100-sxm4-80gb"
[[sweep.options]]
id = "x"
gpu = "h100-sxm5-80gb"
server = "dgx-h100"
network = "ib-ndr"
"""


@pytest.mark.parametrize(
    "options",
    [
        DUPLICATE_IDS,
        '[[sweep.options]]\ngpu = "h100-sxm5-80gb"\n[[sweep.options]]\ngpu = "h100-sxm5-80gb"\n',
    ],
)
def test_two_options_with_one_id_are_refused(
    tmp_path: Path, options: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Their rows shared keys: exit 0 with one option's rows silently gone."""
    path = tmp_path / "dup.toml"
    path.write_text(TINY.read_text() + options)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--serial", "--no-progress", "--out", str(out)]) == 2
    _one_line_error(capsys, "sweep.options[1]: duplicate option id")
    assert not out.exists()


@pytest.mark.parametrize(
    ("override", "single"),
    [
        ("sweep.world_size=[8, 8]", "sweep.world_size=[8]"),
        (
            "sweep.options=[{id='a', num_gpus=[8, 4, 8]}]",
            "sweep.options=[{id='a', num_gpus=[8, 4]}]",
        ),
    ],
)
def test_a_repeated_gpu_count_is_one_cluster_size(override: str, single: str) -> None:
    twice = enumerate_space(load_scenario(TINY, overrides=(override,)))
    once = enumerate_space(load_scenario(TINY, overrides=(single,)))
    assert [c.id for c in twice.contexts] == [c.id for c in once.contexts]
    assert twice.points == once.points
