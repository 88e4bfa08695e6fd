"""Sweeps on Ray: a worker that dies on one layout, Ctrl-C while the local Ray starts or
mid-sweep (its message on a line of its own)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import simulator.sweep as sweep
import simulator.sweep_commands as sweep_commands
from simulator.cli import main
from simulator.scenario import load_scenario
from simulator.space import enumerate_space, find_scenario, point_keys
from simulator.sweep import RayOptions, run_sweep
from simulator.sweep_eval import build_shared

TINY = find_scenario("tiny-gpt-8gpu")


def test_ctrl_c_while_ray_starts_stops_the_ray_it_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C inside ``ray.init`` used to leave Ray's agents running a minute after tilesim
    exited (Ray had not yet noted them, so nothing stopped them): now ``ray.init`` finishes,
    the Ray it started is shut down, and then the interrupt goes on as KeyboardInterrupt."""
    import ray

    calls: list[str] = []

    def init(**kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C halfway through the start
        calls.append("init finished")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    # Python's own Ctrl-C handler, as at a terminal: a shell that starts the tests in the
    # background (`nohup ... &`) has them ignore SIGINT, and no Ctrl-C would arrive
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            sweep._ray_init(RayOptions(workers=2))
        assert calls == ["init finished", "shutdown"]
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, ignored)


@pytest.mark.ray
def test_a_layout_that_kills_its_worker_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """One layout whose evaluation kills the Ray worker (a crash, the OOM killer) used to turn
    its whole chunk (up to 500 screen layouts) into error rows; now only it fails, and the
    other layouts of its chunk get the serial rows."""
    scenario = load_scenario(TINY)
    space = enumerate_space(scenario)
    shared = build_shared(space, scenario.run)
    points = space.points[:8]
    poison = point_keys(points, space.contexts)[5]
    evaluate = sweep._ray_chunk

    def dying(tier: Any, chunk: Any, token: str, boxed: list[Any]) -> bytes:
        if poison in point_keys(chunk, shared.contexts):
            os._exit(1)
        return evaluate(tier, chunk, token, boxed)

    monkeypatch.setattr(sweep, "_ray_chunk", dying)  # pickled by value: the workers run it
    monkeypatch.setattr(sweep, "MAX_RETRIES", 0)  # the retries add time, not behaviour
    serial = run_sweep("screen", points, shared, executor="serial")
    rows = run_sweep(
        "screen", points, shared, executor="ray", chunk_size=8, ray_options=RayOptions(workers=2)
    )
    assert [r["key"] for r in rows] == [r["key"] for r in serial]
    failed = [r for r in rows if r["status"] == "error"]
    assert [r["key"] for r in failed] == [poison]
    assert "worker died" in failed[0]["reason"]
    kept = [json.dumps(r) for r in rows if r["key"] != poison]
    assert kept == [json.dumps(r) for r in serial if r["key"] != poison]


def test_ctrl_c_mid_sweep_prints_its_line_after_the_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The interrupt message used to be glued to the end of the progress bar's line (the bar
    was closed only later, redrawing itself after the message)."""

    def interrupted(*args: Any, **kwargs: Any) -> list[Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_commands, "run_sweep", interrupted)
    out = tmp_path / "out"
    assert main(["sweep", str(TINY), "--serial", "--out", str(out)]) == 130
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert [line for line in lines if line.strip()][-1] == (
        f"tilesim: interrupted; rerun the same command to resume ({out})"
    )
