"""Sweeps: the layout space, the closed-form screen, serial rows, resume, errors, reports."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.pipeline_forms import in_flight_closed
from simulator.report import procurement_table, rank
from simulator.saved_rows import load_rows
from simulator.scenario import load_scenario, resolve
from simulator.schedules import SCHEDULES, in_flight
from simulator.screen import screen
from simulator.screen_cache import ScreenCache
from simulator.simulate import latency_table, simulate
from simulator.space import enumerate_space, find_scenario
from simulator.sweep import RayOptions, ray_session, run_sweep
from simulator.sweep_chunks import _graph_tasks, _piece_cost, _shape_key, simulate_chunks
from simulator.sweep_eval import build_shared
from tests.support import TOY_GPT_A100

TINY = find_scenario("tiny-gpt-8gpu")
PROCUREMENT = (
    '[study]\nname = "tiny-procurement"\n'
    + TOY_GPT_A100
    + """[sweep]
train_tokens = [1.0e9]
tp = [1, 2]
pp = [1, 2]
[[sweep.options]]
id = "a100"
num_gpus = [4, 8]
price_per_gpu_hour = 2.0
power_w_per_gpu = 1000.0
[[sweep.options]]
id = "h100"
gpu = "h100-sxm5-80gb"
server = "dgx-h100"
network = "ib-ndr"
num_gpus = [8]
price_per_gpu_hour = 3.0
"""
)


def _sweep(out: Path, *extra: str) -> int:
    return main(["sweep", str(TINY), "--serial", "--no-progress", "--out", str(out), *extra])


def test_space_layouts_are_valid_and_distinct() -> None:
    space = enumerate_space(load_scenario(TINY))
    assert space.points and space.pruned > 0
    for p in space.points:
        n = space.contexts[p.context].inputs.num_gpus
        assert p.tp * p.pp * p.dp * p.cp == n
        assert not (p.pp == 1 and p.schedule != "1f1b")
    keys = [p.key(space.contexts[p.context].id) for p in space.points]
    assert len(set(keys)) == len(keys)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sweep.world_size=[0]", "sweep.world_size: 0 is not a positive whole number"),
        ("sweep.world_size=[1.5]", "sweep.world_size: 1.5 is not a positive whole number"),
        ("sweep.train_tokens=[-5]", "sweep.train_tokens: -5; give a finite positive number"),
        ("sweep.train_tokens=[1e9, 2e9]", "give one token budget"),
        ("sweep.options=[{num_gpus = [0]}]", r"sweep.options\[0\].num_gpus: 0"),
        ("sweep.options=[{price_per_gpu_hour = -1}]", r"price_per_gpu_hour: -1; give a finite"),
    ],
)
def test_bad_sweep_values_are_config_errors(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        enumerate_space(load_scenario(TINY, overrides=(override,)))


def test_unknown_sweep_key_is_a_config_error() -> None:
    bad = load_scenario(TINY, overrides=("sweep.tpp=[2]",))
    with pytest.raises(ConfigError, match="tpp"):
        enumerate_space(bad)
    with pytest.raises(ConfigError, match=r"sweep\.schedule"):
        enumerate_space(load_scenario(TINY, overrides=("sweep.schedule=['zigzag']",)))
    with pytest.raises(ConfigError, match=r"'run\.dtype'.*`tilesim list keys`"):
        load_scenario(TINY, overrides=("run.dtype='bf16'",))  # dtype lives in [training]


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_in_flight_closed_form_matches_the_schedules(schedule: str) -> None:
    for pp in (1, 2, 3, 4, 8):
        for v in (1, 2, 3) if schedule != "1f1b" else (1,):
            for m in (1, 2, 4, 6, 8, 16):
                if schedule == "1f1b-interleaved" and v > 1 and m % pp:
                    continue
                orders = SCHEDULES[schedule](pp, m, v)
                for s in range(pp):
                    assert in_flight_closed(schedule, pp, m, v, s) == in_flight(orders[s])


def test_screen_tracks_simulate() -> None:
    scenario = load_scenario(TINY)
    space = enumerate_space(scenario)
    shared = build_shared(space, scenario.run)
    for p in space.points[::3]:
        ctx, table = shared.contexts[p.context], shared.tables[p.context]
        run = p.run(scenario.run)
        est = screen(ScreenCache(ctx.inputs, table), run)
        sim = simulate(ctx.inputs, run, table)
        assert est.memory.total_bytes / 2**30 == pytest.approx(sim.memory_gib_per_gpu, rel=1e-9)
        assert est.tokens_per_s == pytest.approx(sim.tokens_per_s, rel=0.2)


@pytest.mark.parametrize(("pp", "rel"), [(1, 1e-9), (2, 0.1)])
def test_screen_prices_deepspeed_zero3_like_the_simulation(pp: int, rel: float) -> None:
    """One stage: both put every blocking ZeRO-3 collective on the step's path, so they agree
    exactly; with a pipeline, within the screen's usual closed-form error."""
    sets = ("run.tp=1", f"run.pp={pp}", "run.dp=0", "run.zero_stage=3", "run.recompute='full'")
    s = load_scenario(TINY, overrides=(*sets, "run.zero3_impl='deepspeed-2021'"))
    inputs = resolve(s)
    table = latency_table(inputs, [s.run])
    est = screen(ScreenCache(inputs, table), s.run)
    sim = simulate(inputs, s.run, table)
    assert est.iteration_s == pytest.approx(sim.iteration_s, rel=rel)


def test_serial_sweep_writes_rows_report_and_figures(tmp_path: Path) -> None:
    assert _sweep(tmp_path) == 0
    rows = load_rows(tmp_path)
    assert [r["key"] for r in rows] == sorted({r["key"] for r in rows})
    assert {r["tier"] for r in rows} == {"screen", "simulate"} or all(
        r["tier"] == "simulate" for r in rows if r["status"] == "ok"
    )
    for name in ("rows.csv", "report.md", "scenario.resolved.json", "pareto.png", "scaling.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "## Top 10" in (tmp_path / "report.md").read_text()
    for png in tmp_path.glob("*.png"):
        png.unlink()
    assert main(["plot", str(tmp_path)]) == 0
    assert len(list(tmp_path.glob("*.png"))) == 4


def test_interrupted_sweep_resumes_to_identical_rows(tmp_path: Path) -> None:
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert _sweep(full, "--candidates", "6") == 0
    # An interrupt: half the progress log survives, the last line torn mid-write.
    lines = (full / "progress.jsonl").read_text().splitlines(keepends=True)
    cut.mkdir()
    kept = lines[: len(lines) // 2]
    (cut / "progress.jsonl").write_text("".join(kept) + lines[-1][:40])
    (cut / "progress.meta.json").write_text((full / "progress.meta.json").read_text())
    assert _sweep(cut, "--candidates", "6") == 0
    assert load_rows(cut) == load_rows(full)
    resumed = (cut / "progress.jsonl").read_text().splitlines(keepends=True)
    assert resumed[: len(kept)] == kept  # the surviving rows were kept, not recomputed
    logged = [json.loads(x) for x in resumed]
    assert len({(r["key"], r["tier"]) for r in logged}) == len(logged) == len(lines)


def test_rows_of_another_scenario_in_the_same_folder_are_not_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rerunning into one --out with other --set values used to resume the first sweep's rows,
    so layouts outside the new space were ranked and reported."""
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert _sweep(out) == 0
    assert _sweep(out, "--set", "sweep.tp=[1]") == 0
    assert "another scenario" in capsys.readouterr().err
    assert {r["tp"] for r in load_rows(out)} == {1}
    assert _sweep(fresh, "--set", "sweep.tp=[1]") == 0
    assert load_rows(out) == load_rows(fresh)


def test_a_log_of_other_code_is_not_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full, other = tmp_path / "full", tmp_path / "other"
    assert _sweep(full, "--candidates", "6") == 0
    other.mkdir()
    stale = [dict(json.loads(x), iteration_s=1.0) for x in (full / "progress.jsonl").open()]
    (other / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stale))
    (other / "progress.meta.json").write_text('{"fingerprint": "older-tilesim"}\n')
    assert _sweep(other, "--candidates", "6") == 0
    assert "starting afresh" in capsys.readouterr().err
    assert load_rows(other) == load_rows(full)


def test_a_failing_layout_is_recorded_and_the_others_finish() -> None:
    scenario = load_scenario(TINY)
    space = enumerate_space(scenario)
    shared = build_shared(space, scenario.run)
    broken = replace(shared, tables=({}, *shared.tables[1:]))  # context 0 lacks its kernels
    rows = run_sweep("screen", space.points, broken, chunk_size=7)
    failed = [r for r in rows if r["status"] == "error"]
    assert failed and all(r["context"] == space.contexts[0].id for r in failed)
    assert all("KeyError" in r["reason"] and "Traceback" in r["error"] for r in failed)
    assert any(r["status"] == "ok" for r in rows)


def test_procurement_report_costs_each_option(tmp_path: Path) -> None:
    path = tmp_path / "study.toml"
    path.write_text(PROCUREMENT)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--serial", "--no-progress", "--out", str(out)]) == 0
    rows = load_rows(out)
    best = rank(rows, "cost")
    assert best and all(r["cost_usd"] is not None for r in best)
    r = best[0]
    hours = 488_282 * r["iteration_s"] / 3600  # ceil(1e9 / (16 x 128)) whole steps
    assert r["cost_usd"] == pytest.approx(hours * r["num_gpus"] * r["price_per_gpu_hour"])
    table = procurement_table(rows, by="cost")
    assert "a100" in table and "h100" in table
    for by in ("cost", "time"):  # tiny has no token budget: refused before any work
        assert main(["sweep", str(TINY), "--serial", "--out", str(out / "t"), "--rank", by]) == 2
        assert not (out / "t").exists()


def test_plot_redraws_with_the_sweeps_own_ranking(tmp_path: Path) -> None:
    """`tilesim plot DIR` after a ``--rank cost`` sweep drew its figures ranked by tokens/s."""
    path = tmp_path / "study.toml"
    path.write_text(PROCUREMENT)
    out = tmp_path / "out"
    argv = ["sweep", str(path), "--serial", "--no-progress", "--out", str(out), "--rank", "cost"]
    assert main(argv) == 0
    drawn = {png.name: png.read_bytes() for png in out.glob("*.png")}
    for png in out.glob("*.png"):
        png.unlink()
    assert main(["plot", str(out)]) == 0
    assert {png.name: png.read_bytes() for png in out.glob("*.png")} == drawn
    assert main(["plot", str(out), "--rank", "tokens"]) == 0  # asked for: another ranking
    assert (out / "top_layouts.png").read_bytes() != drawn["top_layouts.png"]


@pytest.mark.parametrize("flag", ["--workers", "--top"])
def test_a_count_below_one_is_refused_before_anything_is_written(
    tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _sweep(out, flag, "0") == 2
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err
    assert not out.exists()


def test_an_output_path_that_cannot_be_a_folder_is_refused(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("a file")
    assert _sweep(taken) == 2
    assert _sweep(taken / "below") == 2
    assert taken.read_text() == "a file"


def test_a_sweep_that_would_simulate_nothing_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _sweep(out, "--candidates", "0", "--per-context", "0") == 2
    assert not out.exists()


def test_an_address_where_no_ray_listens_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    argv = ["sweep", str(TINY), "--no-progress", "--out", str(out)]
    assert main([*argv, "--address", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"--address 127.0.0.1:{port}: cannot connect" in err and "Traceback" not in err
    assert not out.exists()


@pytest.fixture
def ray_head() -> Iterator[str]:
    """A real Ray head (`ray start --head --block`, no token authentication) on a free local
    port, stopped after the test: only its own process group is killed, never `ray stop`
    (which ends every Ray of this user), and Ray's note of the current cluster is restored."""
    ray_cli = Path(sys.executable).with_name("ray")
    if not ray_cli.is_file():
        pytest.skip(f"no ray command beside {sys.executable}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from ray._common.utils import get_ray_address_file  # where `ray start` notes its head

    address_file = Path(get_ray_address_file(None))
    noted = address_file.read_text() if address_file.is_file() else None
    cmd = [str(ray_cli), "start", "--head", "--block", "--port", str(port), "--num-cpus", "2"]
    cmd += ["--disable-usage-stats", "--include-dashboard", "false"]
    head = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or head.poll() is not None:
                    pytest.fail(f"ray start --head did not listen on {port}")
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # SIGTERM: half a minute of graceful shutdown
        head.wait(timeout=60)
        # a killed head leaves its address noted: put back what was there before
        if noted is None:
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(noted)


@pytest.mark.ray
def test_sweep_beside_and_on_a_running_ray_cluster(tmp_path: Path, ray_head: str) -> None:
    """With a cluster running on this machine, the default sweep still starts its own
    embedded Ray (it used to join that cluster and fail), and `--address HOST:PORT` runs on
    the cluster; both give the rows of a serial run."""
    serial, embedded, joined = tmp_path / "serial", tmp_path / "embedded", tmp_path / "joined"
    assert _sweep(serial) == 0
    argv = ["sweep", str(TINY), "--no-progress"]
    assert main([*argv, "--out", str(embedded), "--workers", "2"]) == 0
    assert main([*argv, "--out", str(joined), "--address", ray_head]) == 0
    assert load_rows(embedded) == load_rows(serial)
    assert load_rows(joined) == load_rows(serial)


@pytest.mark.ray
def test_ray_sweep_equals_serial_bit_for_bit() -> None:
    scenario = load_scenario(TINY)
    space = enumerate_space(scenario)
    shared = build_shared(space, scenario.run)
    points = space.points[:6]
    with ray_session("ray", RayOptions(workers=2)):  # one local Ray for both tiers
        for tier in ("screen", "simulate"):
            serial = run_sweep(tier, points, shared, executor="serial")
            ray = run_sweep(tier, points, shared, executor="ray", chunk_size=2)
            assert json.dumps(ray) == json.dumps(serial)


def test_simulate_chunks_keep_shapes_whole_heaviest_first() -> None:
    scenario = load_scenario(TINY)
    space = enumerate_space(scenario)
    shared = build_shared(space, scenario.run)
    size = 8
    chunks = simulate_chunks(space.points, size, shared)
    flat = [p for c in chunks for p in c]
    assert len(flat) == len(space.points) and set(flat) == set(space.points)
    assert all(0 < len(c) <= size for c in chunks)
    shapes: dict[tuple[object, ...], list[int]] = {}
    for i, c in enumerate(chunks):
        for p in c:
            shapes.setdefault(_shape_key(p), []).append(i)
    assert all(len(set(at)) == 1 for at in shapes.values() if len(at) <= size)
    cost = [_graph_tasks(p, shared) for p in flat]
    assert cost == sorted(cost, reverse=True)
    # Shapes share a chunk only while it stays within an average full chunk's cost.
    pieces = {_shape_key(p): [q for q in flat if _shape_key(q) == _shape_key(p)] for p in flat}
    budget = sum(_piece_cost(g, shared) for g in pieces.values()) * size / len(flat)
    for c in chunks:
        shapes_in = {_shape_key(p) for p in c}
        if len(shapes_in) > 1:
            assert (
                sum(_piece_cost([p for p in c if _shape_key(p) == k], shared) for k in shapes_in)
                <= budget
            )
    assert len({_shape_key(p) for p in chunks[0]}) == 1  # the heaviest shape: a task of its own


def test_the_screen_leads_the_tiering_to_the_exhaustive_best() -> None:
    """Simulating only the screen's best 3 (+1 per cluster) finds the layout that simulating
    all 44 finds; the two tiers agree on which layouts fit."""
    from simulator.space import point_keys
    from simulator.sweep_eval import select_candidates

    scenario = load_scenario(TINY)
    space = enumerate_space(scenario)
    shared = build_shared(space, scenario.run)
    screened = {r["key"]: r for r in run_sweep("screen", space.points, shared)}
    full = {r["key"]: r for r in run_sweep("simulate", space.points, shared)}
    assert set(screened) == set(full) == set(point_keys(space.points, space.contexts))
    assert all(screened[k]["fits"] == full[k]["fits"] for k in full)
    best = max(full.values(), key=lambda r: r["tokens_per_s"])
    chosen = select_candidates(list(screened.values()), top=3, per_context=1)
    assert len(chosen) < len(full) / 4
    assert best["key"] in chosen
