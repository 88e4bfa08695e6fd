"""``collective --oversubscription R --nodes-per-leaf N``: the fat tree's leaf groups and their
thinned uplinks, as a scenario's ``cluster.oversubscription`` and ``cluster.nodes_per_leaf``
set them. Before, the command had neither flag (argparse refused them)."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from topologies import collective_time_s, load_cluster

ARGV = ["collective", "--op", "all-to-all", "--bytes", "1e9", "--gpus", "32"]
ARGV += ["--cluster", "dgx-h100", "--json"]


def _cli_s(capsys: pytest.CaptureFixture[str], *extra: str) -> float:
    assert main([*ARGV, *extra]) == 0
    return float(json.loads(capsys.readouterr().out)["time_s"])


def test_the_flags_reach_the_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    flat = _cli_s(capsys)
    # one node a leaf, uplinks at 1/3: every byte leaving a node crosses the spine
    over = _cli_s(capsys, "--oversubscription", "3", "--nodes-per-leaf", "1")
    c = load_cluster("dgx-h100", gpus=32, oversubscription=3.0, nodes_per_leaf=1)
    assert over == collective_time_s("all-to-all", 1e9, range(32), c)
    assert over > 2 * flat
    # the default 32 nodes a leaf holds all 4 nodes: nothing crosses the spine
    assert _cli_s(capsys, "--oversubscription", "3") == flat
    assert _cli_s(capsys, "--nodes-per-leaf", "1") == flat


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--oversubscription", "0.5"),
        ("--oversubscription", "0"),
        ("--oversubscription", "-2"),
        ("--oversubscription", "nan"),
        ("--oversubscription", "inf"),
        ("--oversubscription", "x"),
        ("--nodes-per-leaf", "0"),
        ("--nodes-per-leaf", "-1"),
        ("--nodes-per-leaf", "1.5"),
    ],
)
def test_bad_values_are_one_line_exit_2(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*ARGV, flag, value]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert flag in err
