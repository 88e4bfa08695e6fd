"""Scenario loading, layout checks, sharded FLOPs, memory, the golden tiny step and the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from forecast.kernels import GEMM_FAMILIES
from simulator.cli import main
from simulator.comm import collective_s
from simulator.dist_memory import layer_activation_bytes
from simulator.errors import ConfigError
from simulator.models import load_model
from simulator.parallel import RunConfig, check_run, split_layers
from simulator.results import forward_flops_per_token
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.simulate import latency_table, layout_of, peak_memory, simulate
from simulator.stagecost import shard_kernels

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
GPT3 = ROOT / "scenarios" / "gpt3_175b_a100.toml"
GOLDEN = ROOT / "tests" / "golden" / "tiny_gpt_8gpu.json"


@pytest.fixture(scope="module")
def tiny() -> SimInputs:
    return resolve(load_scenario(TINY))


def test_split_layers_uneven() -> None:
    counts = split_layers(126, 16)
    assert sum(counts) == 126 and max(counts) - min(counts) == 1
    assert counts[0] == counts[-1] == min(counts)
    assert split_layers(8, 4) == [2, 2, 2, 2]


@pytest.mark.parametrize(
    ("override", "key"),
    [("run.tpp=2", "run.tpp"), ("run.tp=3", "run.tp"), ("run.dp=4", "run.dp")],
)
def test_bad_input_names_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        s = load_scenario(TINY, overrides=(override,))
        inputs = resolve(s)
        layout_of(inputs, s.run)


def test_set_override_applies() -> None:
    s = load_scenario(TINY, overrides=("run.recompute='full'", "run.pp=1", "run.dp=4"))
    assert s.run.recompute == "full" and s.run.pp == 1 and s.run.dp == 4


def test_sharded_flops_sum_to_unsharded(tiny: SimInputs) -> None:
    def gemm_flops(tp: int) -> float:
        sk = shard_kernels(tiny, RunConfig(tp=tp))
        return sum(k.flops() * n for k, n in sk.layer_fw if k.family in GEMM_FAMILIES)

    # equal up to the bias of row-parallel linears, which every shard adds (T*H FLOPs)
    assert 4 * gemm_flops(4) == pytest.approx(gemm_flops(1), rel=2e-3)
    assert 2 * gemm_flops(2) == pytest.approx(gemm_flops(1), rel=2e-3)


def test_flop_convention_matches_narayanan() -> None:
    m = load_model("gpt3-175b")
    s, h, n, v = 2048, m.hidden_size, m.num_layers, m.vocab_size
    w, a, head = forward_flops_per_token(m, s)
    eq3 = 72 * s * n * h**2 * (1 + s / (6 * h) + v / (12 * n * h)) / s
    assert 3 * (w + a + head) == pytest.approx(eq3, rel=1e-3)


def test_collective_of_one_rank_is_free(tiny: SimInputs) -> None:
    assert collective_s("all-reduce", 1e9, (0,), tiny.cluster) == 0.0
    one = collective_s("all-reduce", 1e9, (0, 1), tiny.cluster)
    assert one > 0 and collective_s("all-reduce", 2e9, (0, 1), tiny.cluster) > one


def test_memory_by_recompute_and_zero(tiny: SimInputs) -> None:
    def acts(recompute: str) -> float:
        run = RunConfig(tp=2, pp=2, dp=2, micro_batch_size=2, recompute=recompute)  # type: ignore[arg-type]
        return layer_activation_bytes(tiny, layout_of(tiny, run))

    assert acts("full") < acts("selective") <= acts("none")
    z0, z1 = (peak_memory(tiny, layout_of(tiny, RunConfig(dp=8, zero_stage=z))) for z in (0, 1))
    assert z1.optimizer_bytes == pytest.approx(z0.optimizer_bytes / 8)


def test_gpt3_on_too_few_gpus_does_not_fit() -> None:
    sets: tuple[str, ...] = ("cluster.num_gpus=16", "run.pp=2", "run.dp=1", "run.zero_stage=0")
    sets += ("run.virtual_stages=1", "run.schedule='1f1b'", "training.global_batch_size=8")
    s = load_scenario(GPT3, overrides=(*sets, "training.latency_model='roofline'"))
    inputs = resolve(s)
    res = simulate(inputs, s.run, latency_table(inputs, [s.run]))
    assert not res.fits and "GiB" in res.reason


def test_golden_tiny(tiny: SimInputs) -> None:
    s = load_scenario(TINY)
    row = simulate(tiny, s.run, latency_table(tiny, [s.run])).to_row()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(row, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    _close(row, want)


def _close(got: dict[str, object], want: dict[str, object]) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        if isinstance(v, (dict, float)):
            assert got[k] == pytest.approx(v, rel=1e-9), k
        else:
            assert got[k] == v, k


def test_cli_simulate_json_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "step.json"
    assert main(["simulate", str(TINY), "--json", "--trace", str(trace)]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "iteration_s",
        "forward_backward_s",
        "optimizer_s",
        "model_tflops_per_gpu",
        "hardware_tflops_per_gpu",
        "mfu",
        "hfu",
        "tokens_per_s",
        "bubble_fraction",
        "exposed_comm_s",
        "memory_gib_per_gpu",
        "fits",
    ):
        assert key in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["cat"] == "compute" for e in events)


def test_ctrl_c_in_a_command_is_one_line_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("simulator.simulate_commands.simulate_timeline", interrupted)
    assert main(["simulate", str(TINY)]) == 130
    assert capsys.readouterr().err == "tilesim: interrupted\n"


def test_cli_bad_key_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(TINY), "--set", "run.tpp=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.tpp" in err[0]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["run.tp=16"], "run.tp: must divide n_heads"),  # was a traceback from the forecast
        (["cluster.num_gpus=16", "cluster.nics_per_node=0"], "cluster.nics_per_node"),
        (["run.tp=true"], "run.tp"),  # strict: not tp=1
        (["run.zero_stage=2.0"], "run.zero_stage"),
        (['run.sequence_parallel="yes"'], "run.sequence_parallel"),
        (["training.global_batch_size=8.0"], "training.global_batch_size"),
        (['training.latency_model="tensor-core"'], "training.latency_model"),
        # 4e11 micro-batches: a graph that never finishes building (was killed for memory)
        (["training.global_batch_size=1600000000000"], "graph tasks"),
    ],
)
def test_cli_simulate_bad_values_are_one_line(
    overrides: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sets = [x for o in overrides for x in ("--set", o)]
    assert main(["simulate", str(TINY), *sets]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_catalog_model_with_inline_sizes_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = ROOT / "scenarios" / "llama3_70b_h100.toml"
    assert main(["simulate", str(scenario), "--set", "model.n_layers=50"]) == 2
    assert "drop the inline key(s) n_layers" in capsys.readouterr().err


@pytest.mark.parametrize("trace", ["", "folder", "file/x.json", "file/missing/x.json"])
def test_cli_trace_path_is_checked_before_work(
    trace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("")
    target = str(tmp_path / trace) if trace else ""
    assert main(["simulate", str(TINY), "--trace", target]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trace" in err[0]


def test_non_utf8_scenario_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe[study]\n")
    assert main(["simulate", str(bad)]) == 2
    assert "cannot read scenario" in capsys.readouterr().err


def test_check_run_checks_interleaving(tiny: SimInputs) -> None:
    run = RunConfig(tp=2, pp=2, dp=2, virtual_stages=2, schedule="1f1b")
    with pytest.raises(ConfigError, match="virtual_stages"):
        check_run(run, tiny.model, num_gpus=8, global_batch_size=16, seq_len=128)


def test_validate_distributed_readme_needs_markers_and_published_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no markers here\n")
    argv = ["validate", "distributed", "--labels-only", "--readme", str(readme)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--labels-only" in err[0]
    assert readme.read_text() == "# no markers here\n"


def test_validate_distributed_refuses_published_with_labels_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--published was ignored under --labels-only, exit 0."""
    argv = ["validate", "distributed", "--labels-only", "--published", str(tmp_path / "p.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tilesim: error: --published: --labels-only")


def test_validate_commands_name_a_data_folder_without_their_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "missing.json")
    for argv, flag in (
        (["validate", "distributed", "--data", str(tmp_path)], "--data"),
        (["validate", "e2e", "--data", str(tmp_path)], "--data"),
        (["validate", "distributed", "--data", str(tmp_path), "--published", missing], "--data"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag in err[0] and "NeuSight data folder" in err[0]


def test_ctrl_c_while_the_command_line_imports_is_one_line_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulator import launch

    def interrupted(name: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(launch.importlib, "import_module", interrupted)
    assert launch.main(["list", "gpus"]) == 130
    assert capsys.readouterr().err == "tilesim: interrupted\n"


def test_console_script_runs_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    from simulator import launch

    assert launch.main(["list", "gpus"]) == 0
    assert "h100-sxm5-80gb" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{", "as JSON ("),  # JSONDecodeError traceback
        ("[1]", "run 0 is not an object with a text id"),  # TypeError traceback
        ("{}", "expected a non-empty JSON list of runs"),  # no published rows, exit 0
        ("[]", "expected a non-empty JSON list of runs"),
        ('[{"id": "r1"}]', "run r1: lacks 'measured'"),
        ('[{"id": "r1", "measured": {"tflops_per_gpu": 0}}]', "measured.tflops_per_gpu"),
    ],
)
def test_published_runs_that_are_no_runs_name_the_file(
    tmp_path: Path, text: str, needle: str
) -> None:
    from simulator.dist_validate import check_published

    path = tmp_path / "runs.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"runs\.json") as info:
        check_published(path=path)
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("garbage", "as a JSON label"),  # JSONDecodeError traceback
        ('{"e2e_latency": "x"}', "e2e_latency must be a finite time in ms"),  # TypeError
        ('{"e2e_latency": -5}', "e2e_latency must be a finite time in ms, got -5"),
    ],
)
def test_validate_distributed_names_a_broken_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    from simulator.dist_validate import LABEL_GPU

    folder = tmp_path / LABEL_GPU
    folder.mkdir(parents=True)
    (folder / "gpt2_large-train-1024-4-dp4.json").write_text(text)
    assert main(["validate", "distributed", "--labels-only", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dp4.json" in err[0] and needle in err[0]
