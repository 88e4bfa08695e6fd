"""A sweep says why it pruned layouts: by rule, with the first pruned layout's reason, in the
error when nothing is left, in the report and in scenario.resolved.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main


def test_nothing_left_names_the_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sweep", "tiny-gpt-8gpu", "--serial", "--out", str(tmp_path / "o")]
    assert main([*args, "--set", "sweep.tp=[3]"]) == 2  # bad input: no layout to forecast
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no valid layout in the sweep (32 pruned: 24 by sizes (tp*pp*cp does not divide" in err
    assert "8 by duplicate (" in err and not (tmp_path / "o").exists()


def test_report_and_resolved_scenario_list_the_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    sets = ["model.n_layers=6", "sweep.schedule=['1f1b','1f1b-interleaved']"]
    sets += ["sweep.virtual_stages=[1,2]", "sweep.micro_batch_size=[1]"]
    args = ["sweep", "tiny-gpt-8gpu", "--serial", "--out", str(out), "--candidates", "2"]
    assert main([*args, *(x for s in sets for x in ("--set", s))]) == 0
    capsys.readouterr()
    resolved = json.loads((out / "scenario.resolved.json").read_text())
    by_rule = resolved["pruned_by"]
    assert sum(by_rule.values()) == resolved["pruned"] and by_rule["run.virtual_stages"] > 0
    report = (out / "report.md").read_text()
    for rule, n in by_rule.items():
        assert f"* {n} by `{rule}`: " in report
    assert "by `run.virtual_stages`: > 1 needs schedule = 1f1b-interleaved" in report


def test_layout_label_shows_every_key_that_tells_rows_apart() -> None:
    """cp and the distributed optimizer show in the label (a cp 2 row printed as tp2 pp4
    dp128 on 2,048 GPUs, and two rows differing in distributed_optimizer printed alike)."""
    from simulator.report import layout_label

    row = {"tp": 2, "pp": 4, "dp": 128, "cp": 2, "micro_batch_size": 1, "schedule": "1f1b"}
    row |= {"virtual_stages": 1, "recompute": "selective", "zero_stage": 1}
    row |= {"sequence_parallel": True, "distributed_optimizer": False}
    assert layout_label(row) == "tp2 cp2 pp4 dp128 mbs1 1f1b selective z1 sp"
    other = row | {"cp": 1, "distributed_optimizer": True}
    assert layout_label(other) == "tp2 pp4 dp128 mbs1 1f1b selective z1 sp dist-opt"


def test_a_twin_missing_from_the_grid_is_kept_in_its_plain_form(tmp_path: Path) -> None:
    """ZeRO over one data-parallel rank, sequence parallelism at tp 1 and a pipeline schedule
    at pp 1 run as the plain layout: kept under their plain values when the grid does not
    list that plain twin (the tiny scenario keeps zero_stage 1 and never evaluated its dp 1
    layouts), and pruned as a duplicate when it does."""
    from simulator.scenario import load_scenario
    from simulator.space import enumerate_space, find_scenario

    tiny = find_scenario("tiny-gpt-8gpu")
    only_sp = ["sweep.sequence_parallel=[true]", "sweep.world_size=[8]", "sweep.tp=[1,2]"]
    space = enumerate_space(load_scenario(tiny, overrides=[*only_sp, "sweep.pp=[1]"]))
    tp1 = [p for p in space.points if p.tp == 1]
    assert tp1 and not any(p.sequence_parallel for p in tp1)
    assert all(p.sequence_parallel for p in space.points if p.tp == 2)
    dp1 = ["sweep.world_size=[8]", "sweep.tp=[4]", "sweep.pp=[2]", "run.zero_stage=1"]
    points = enumerate_space(load_scenario(tiny, overrides=dp1)).points
    assert points and all(p.dp == 1 and p.zero_stage == 0 for p in points)
    both = enumerate_space(load_scenario(tiny, overrides=[*dp1, "sweep.zero_stage=[0,1]"]))
    assert [p.zero_stage for p in both.points] == [0] * len(points)
    assert {r: n for r, n, _ in both.pruned_by}["duplicate"] >= len(points)
