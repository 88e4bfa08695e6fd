"""Sweep input checks found by a user-path hunt: each bad input is one line and exit 2 before
any work, a rerun into a used folder gives what a fresh folder gives, and foreign or corrupt
files are named, not tracebacks."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from forecast.gpus import CATALOG_DIR as GPUS_DIR
from simulator import sweep_commands
from simulator.cli import main
from simulator.errors import ConfigError
from simulator.rows import PROGRESS
from simulator.saved_rows import load_rows
from simulator.scenario import load_scenario
from simulator.space import enumerate_space, find_scenario
from simulator.sweep import check_address, run_sweep
from simulator.sweep_eval import build_shared
from simulator.sweep_folder import FIGURES
from simulator.sweep_folder import inputs_digest as _inputs_digest
from tests.support import error_line

TINY = find_scenario("tiny-gpt-8gpu")
ARGV = ["sweep", str(TINY), "--serial", "--no-progress"]


def _sweep(out: Path | str, *extra: str) -> int:
    return main([*ARGV, "--out", str(out), *extra])


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
    error_line(capsys, key)
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
    error_line(capsys, key, "finite")
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
    error_line(capsys, key)
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
    error_line(capsys, "sweep.options[1]: duplicate option id")
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


def test_an_edited_gpu_file_is_not_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The resume fingerprint held the scenario's text, not the files it names: a GPU TOML
    with 10x less bandwidth resumed the old rows."""
    gpu = tmp_path / "gpu.toml"
    shutil.copy(GPUS_DIR / "a100-sxm4-80gb.toml", gpu)
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    use = ("--set", f"cluster.gpu='{gpu}'", "--candidates", "2", "--per-context", "0")
    assert _sweep(out, *use) == 0
    before = load_rows(out)
    text = gpu.read_text()
    assert "\nhbm_bw_bytes_per_s = " in text
    lines = [
        f"hbm_bw_bytes_per_s = {float(x.split('=')[1].split('#')[0]) / 10}"
        if x.startswith("hbm_bw_bytes_per_s =")
        else x
        for x in text.splitlines()
    ]
    gpu.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert _sweep(out, *use) == 0
    assert "starting afresh" in capsys.readouterr().err
    assert _sweep(fresh, *use) == 0
    assert load_rows(out) == load_rows(fresh) != before


def test_the_inputs_digest_holds_the_model_files(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    gpt = {"model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 8, "vocab_size": 1024}
    config.write_text(json.dumps({**gpt, "n_positions": 1024}))
    text = TINY.read_text()
    for key in ("n_layers", "hidden_size", "n_heads", "vocab_size"):
        text = "\n".join(x for x in text.splitlines() if not x.startswith(f"{key} ="))
    path = tmp_path / "hf.toml"
    path.write_text(text.replace("[model]", '[model]\nhf_config = "config.json"'))

    def digest() -> str:
        scenario = load_scenario(path)
        return _inputs_digest(scenario, enumerate_space(scenario))

    first = digest()
    assert digest() == first
    config.write_text(json.dumps({**gpt, "n_positions": 2048}))  # not even a size we use
    assert digest() != first


def test_a_rerun_with_fewer_candidates_reports_only_its_own(tmp_path: Path) -> None:
    """The log's simulated rows of a first run with 48 candidates were all reported again
    (44 simulated rows instead of 1)."""
    used, fresh = tmp_path / "used", tmp_path / "fresh"
    assert _sweep(used) == 0
    few = ("--candidates", "1", "--per-context", "0")
    assert _sweep(used, *few) == 0
    assert _sweep(fresh, *few) == 0
    rows = load_rows(used)
    assert sum(r["tier"] == "simulate" for r in rows) == 1
    assert rows == load_rows(fresh)
    assert (used / "report.md").read_text() == (fresh / "report.md").read_text()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"a": 1}\n', "rows.jsonl:1: not a sweep row (lacks key"),
        (b"[1, 2, 3]\n", "rows.jsonl:1: not a sweep row (is not a JSON object)"),
        (b"\xff\xfe\n", "rows.jsonl: cannot read it as UTF-8"),
        (None, "rows.jsonl: not a file"),
    ],
)
def test_plot_of_foreign_rows_names_the_file(
    tmp_path: Path, content: bytes | None, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "rows.jsonl"
    if content is None:
        rows.mkdir()
    else:
        rows.write_bytes(content)
    assert main(["plot", str(tmp_path)]) == 2
    error_line(capsys, needle)


def test_plot_refuses_nan_and_a_folder_where_a_figure_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _sweep(tmp_path / "ok") == 0
    good = (tmp_path / "ok" / "rows.jsonl").read_text().splitlines()
    row = json.loads(good[0])
    bad = tmp_path / "nan"
    bad.mkdir()
    (bad / "rows.jsonl").write_text(json.dumps(row | {"screen_iteration_s": math.nan}) + "\n")
    capsys.readouterr()
    assert main(["plot", str(bad)]) == 2
    error_line(capsys, "rows.jsonl:1", "NaN")
    (tmp_path / "ok" / "pareto.png").unlink()
    (tmp_path / "ok" / "pareto.png").mkdir()
    assert main(["plot", str(tmp_path / "ok")]) == 2
    error_line(capsys, "pareto.png is not a file")


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("tokens_per_s", "abc"),  # TypeError: bad operand type for unary -
        ("memory_gib_per_gpu", None),  # TypeError: '<' not supported ... NoneType
        ("iteration_s", None),  # TypeError in the top-layouts bars
        ("context", 5),  # AttributeError: 'int' object has no attribute 'rpartition'
        ("bubble_fraction", "x"),  # ValueError: Unknown format code '%'
        ("exposed_dp_s", "x"),
        ("tokens_per_s", -5),  # drawn as a negative throughput
        ("num_gpus", 0),
        ("tp", 1.5),
        ("fits", 1),
    ],
)
def test_plot_of_hand_edited_rows_names_the_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str, value: object
) -> None:
    assert _sweep(tmp_path / "ok") == 0
    rows = [json.loads(line) for line in (tmp_path / "ok" / "rows.jsonl").read_text().splitlines()]
    n = next(i for i, r in enumerate(rows) if r["tier"] == "simulate" and r["status"] == "ok")
    rows[n][column] = value
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main(["plot", str(edited)]) == 2
    error_line(capsys, f"rows.jsonl:{n + 1}: not a sweep row ({column}")
    assert sorted(p.name for p in edited.iterdir()) == ["rows.jsonl"]


def test_plot_of_the_sweep_log_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """progress.jsonl holds rows of both tiers: it was plotted over the sweep's figures."""
    assert _sweep(tmp_path / "ok") == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "ok").iterdir()}
    capsys.readouterr()
    assert main(["plot", str(tmp_path / "ok" / "progress.jsonl")]) == 2
    error_line(capsys, "progress.jsonl: not a rows.jsonl")
    assert {p.name: p.read_bytes() for p in (tmp_path / "ok").iterdir()} == before
    assert main(["plot", str(tmp_path / "ok" / "rows.jsonl")]) == 0


def test_plot_of_rows_with_nothing_ranked_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only screened rows (every layout's simulation lost): it printed nothing and exited 0."""
    assert _sweep(tmp_path / "ok") == 0
    lines = (tmp_path / "ok" / "rows.jsonl").read_text().splitlines()
    screened = [json.loads(line) | {"tier": "screen"} for line in lines]
    only = tmp_path / "screened"
    only.mkdir()
    (only / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in screened))
    capsys.readouterr()
    assert main(["plot", str(only)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tilesim: infeasible: ") and "no figure" in err and "\n" not in err
    assert sorted(p.name for p in only.iterdir()) == ["rows.jsonl"]


def test_figures_named_for_the_checks_are_the_plots() -> None:
    from simulator.plots import PLOTS

    assert tuple(PLOTS) == FIGURES


@pytest.mark.parametrize("meta", ["garbage", "[1]", "\udcff"])
def test_an_unreadable_progress_meta_starts_afresh(
    tmp_path: Path, meta: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert _sweep(out, "--candidates", "2") == 0
    (out / "progress.meta.json").write_bytes(meta.encode(errors="surrogateescape"))
    capsys.readouterr()
    assert _sweep(out, "--candidates", "2") == 0
    assert "starting afresh" in capsys.readouterr().err
    assert _sweep(fresh, "--candidates", "2") == 0
    assert load_rows(out) == load_rows(fresh)


def test_foreign_lines_in_the_progress_log_are_dropped(tmp_path: Path) -> None:
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert _sweep(out, "--candidates", "2") == 0
    with (out / PROGRESS).open("ab") as f:
        f.write(b'{"a": 1}\n[1]\n\xff\xfe\n')
    assert _sweep(out, "--candidates", "2") == 0
    assert _sweep(fresh, "--candidates", "2") == 0
    assert load_rows(out) == load_rows(fresh)


@pytest.mark.parametrize("name", ["rows.jsonl", "report.md", "progress.jsonl", "scaling.png"])
def test_a_folder_where_the_sweep_writes_a_file_is_refused_before_work(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    (out / name).mkdir(parents=True)
    assert _sweep(out) == 2
    error_line(capsys, f"{out / name} is not a file")
    assert sorted(p.name for p in out.iterdir()) == [name]


@pytest.mark.parametrize("address", ["nonsense", "localhost:abc", "localhost:0", "ray://", ""])
def test_a_malformed_address_is_refused_by_name(
    tmp_path: Path, address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ray raised `ValueError: Invalid address format` with a traceback."""
    out = tmp_path / "out"
    argv = ["sweep", str(TINY), "--no-progress", "--out", str(out), "--address", address]
    assert main(argv) == 2
    error_line(capsys, "--address", "HOST:PORT", "auto", "ray://")
    assert not out.exists()


@pytest.mark.parametrize("address", ["auto", "10.0.0.1:6379", "head:6379", "ray://head:10001"])
def test_well_formed_addresses_pass_the_check(address: str) -> None:
    check_address(address)


@pytest.mark.parametrize("where", ["setup", "finish"])
def test_ctrl_c_in_any_phase_is_one_line(
    tmp_path: Path,
    where: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ctrl-C while the kernel tables were forecast, or while rows and figures were written,
    gave a KeyboardInterrupt traceback; the rerun resumes as after an interrupt mid-sweep."""
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert _sweep(fresh, "--candidates", "2") == 0

    def interrupt(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    target = "build_shared" if where == "setup" else "write_rows"
    with monkeypatch.context() as m:
        m.setattr(sweep_commands, target, interrupt)
        capsys.readouterr()
        assert _sweep(out, "--candidates", "2") == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "tilesim: interrupted" in err
    assert not (out / "rows.jsonl").exists()
    assert (where == "setup") == (not out.exists())
    assert _sweep(out, "--candidates", "2") == 0
    assert load_rows(out) == load_rows(fresh)


def test_a_study_name_cannot_lead_the_default_folder_out_of_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    name = "study.name='../../escaped'"
    assert main([*ARGV, "--candidates", "1", "--per-context", "0", "--set", name]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["a"]
    assert [p.name for p in (work / "results").iterdir()] == ["escaped"]


def test_an_empty_out_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out ''`` wrote into the current folder."""
    monkeypatch.chdir(tmp_path)
    assert _sweep("") == 2
    error_line(capsys, "--out ''")
    assert main(["plot", ""]) == 2
    assert list(tmp_path.iterdir()) == []


def test_a_non_finite_result_fails_only_its_layout() -> None:
    scenario = load_scenario(TINY)
    space = enumerate_space(scenario)
    shared = build_shared(space, scenario.run)
    table = dict.fromkeys(shared.tables[0], math.nan)
    broken = replace(shared, tables=(table, *shared.tables[1:]))  # context 0 prices NaN
    rows = run_sweep("screen", space.points, broken)
    failed = [r for r in rows if r["status"] == "error"]
    assert failed and all(r["context"] == space.contexts[0].id for r in failed)
    assert all(r["reason"].startswith("non-finite result: ") for r in failed)
    assert any(r["status"] == "ok" for r in rows)
    for r in rows:
        json.dumps(r, allow_nan=False)


def test_an_option_on_another_server_takes_that_servers_node_shape() -> None:
    # tiny's [cluster] runs dgx-a100 with gpus_per_node = 4; an option on dgx-h100 (8 per node)
    # inherited the 4 before
    opts = '[{id = "h", gpu = "h100-sxm5-80gb", server = "dgx-h100"}, {id = "a"}]'
    scenario = load_scenario(TINY, overrides=(f"sweep.options={opts}",))
    per_node = {
        c.option: c.inputs.cluster.spec.server.gpus_per_node
        for c in enumerate_space(scenario).contexts
    }
    assert per_node == {"h": 8, "a": 4}


def test_many_more_workers_than_cpus_is_a_warning_not_a_refusal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--workers 1000 on 2 CPUs was taken silently (a local Ray of 1000 worker processes)."""
    import argparse

    from simulator import sweep_commands

    many = 2 * sweep_commands.LOCAL_CPUS + 1
    args = argparse.Namespace(workers=many, serial=False, address=None)
    sweep_commands._check_executor(args)
    assert args.workers == many
    assert (
        f"warning: --workers {many} on {sweep_commands.LOCAL_CPUS} CPUs" in capsys.readouterr().err
    )
    sweep_commands._check_executor(argparse.Namespace(workers=1, serial=False, address=None))
    assert capsys.readouterr().err == ""
