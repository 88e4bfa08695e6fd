"""Hostile and mistaken input to the ``tilesim`` command line, round three (a demanding new
user's audit of every subcommand): one line on stderr naming the flag or key and the fix, exit
code 2, no traceback, nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from forecast.files import NotRegularFileError, write_text_atomic
from simulator.cli import main
from simulator.space import find_scenario
from tests.support import refused

TINY = find_scenario("tiny-gpt-8gpu")
SERVE = ["serve", "--model", "tiny-gpt", "--gpu", "a100-sxm4-80gb"]
SERVE += ["--batch", "1", "--prompt", "8", "--gen", "2"]


# --- 1. an output path that is a device or a pipe -------------------------------------------

# every write is whole-or-nothing: a temporary file renamed over the target. Over /dev/full
# (as root) that replaced the device with a regular file and exited 0; over a pipe, the same.
OUTPUT_FLAGS = [
    (["simulate", str(TINY)], "--trace", "t.json"),
    (SERVE, "--plot", "f.png"),
    (["kernels", "validate"], "--out", "v.json"),
    (["kernels", "plot"], "--out", "k.png"),
    (["kernels", "collect", "--device", "cpu"], "--out", "m.csv"),
    (["validate", "e2e"], "--plot", "e.png"),
]


@pytest.mark.parametrize(("argv", "flag", "name"), OUTPUT_FLAGS)
def test_an_output_that_is_a_pipe_is_refused_and_left_a_pipe(
    argv: list[str], flag: str, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    refused([*argv, flag, str(fifo)], capsys, flag, "not a regular file", "give a file path")
    assert fifo.is_fifo()


def test_the_whole_or_nothing_write_refuses_a_pipe_and_writes_through_a_link(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFileError, match="not a regular file"):
        write_text_atomic(fifo, "x")
    assert fifo.is_fifo()
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    link.symlink_to(target.name)
    write_text_atomic(link, "{}")
    assert link.is_symlink() and target.read_text() == "{}"


def test_kernels_collect_into_a_folder_it_cannot_write_is_one_line_before_any_timing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # it was "[Errno 2] No such file or directory: '/proc/.partial-...'", after the first kernels
    argv = ["kernels", "collect", "--device", "cpu", "--out", "/proc/m.csv"]
    refused(argv, capsys, "--out /proc/m.csv: cannot write in /proc", "give another path")
    assert not Path("/proc/.partial-").exists()


# --- 2. sweep flags that the chosen executor ignored ----------------------------------------


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--serial", "--workers", "4"], ("--serial runs without Ray", "--workers would be")),
        (["--serial", "--address", "auto"], ("--serial runs without Ray", "--address would be")),
        (["--address", "auto", "--workers", "4"], ("--address runs on the cluster", "--workers")),
    ],
)
def test_sweep_flags_the_executor_would_ignore_are_refused(
    flags: list[str], needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["sweep", str(TINY), "--no-progress", "--out", str(out), *flags]
    refused(argv, capsys, *needles, "drop one of them")
    assert not out.exists()


def test_sweep_without_workers_runs_serial_and_help_names_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["sweep", str(TINY), "--serial", "--no-progress", "--out", str(out)]
    assert main([*argv, "--candidates", "1", "--per-context", "0"]) == 0
    assert (out / "rows.jsonl").is_file()
    capsys.readouterr()
    assert main(["sweep", "--help"]) == 0
    assert f"this machine's, {os.cpu_count() or 2}" in capsys.readouterr().out


# --- 3. scenario files: a misspelt key, an empty name, an option that is not a table --------


@pytest.mark.parametrize(
    ("old", "new", "needles"),
    [
        # a misspelt table or key was reported as the key it meant ("key 'study': Field
        # required"), which did not name the typo in the file
        ("[study]", "[studyx]", ("key 'studyx' is not a scenario key", "did you mean 'study'")),
        (
            "global_batch_size = 16",
            "global_batch_sze = 16",
            ("'training.global_batch_sze' is not", "did you mean 'training.global_batch_size'"),
        ),
        ('name = "tiny-gpt-8gpu"', 'name = ""', ("key 'study.name'", "must not be empty")),
    ],
)
def test_a_scenario_typo_or_empty_name_is_one_line_naming_it(
    old: str, new: str, needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.toml"
    text = TINY.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    refused(["simulate", str(path)], capsys, *needles)


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("sweep.options=[1]", ("sweep.options[0]: 1 is not a table", "[[sweep.options]]")),
        # the GPU has no fp8 rate: the line named `dtype`, no key of the scenario
        ('training.dtype="fp8"', ("training.dtype fp8: a100-sxm4-80gb has no fp8", "use one of")),
    ],
)
def test_a_sweep_override_of_the_wrong_shape_or_dtype_names_its_key(
    override: str, needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["sweep", str(TINY), "--serial", "--no-progress", "--out", str(out)]
    refused([*argv, "--set", override], capsys, *needles)
    assert not out.exists()
    if override.startswith("training."):
        refused(["simulate", str(TINY), "--set", override], capsys, *needles)


# --- 4. kernels, GPUs and collectives ---------------------------------------------------------

KERNEL = ["kernels", "predict", "--gpu", "a100-sxm4-80gb"]


@pytest.mark.parametrize(
    ("op", "dims", "got"),
    [("gemm", "0,10,10", "0"), ("gemm", "-1,10,10", "-1"), ("bmm", "1,2,0,4", "0")],
)
def test_a_size_below_one_names_dims_not_the_kernels_internal_tuple(
    op: str, dims: str, got: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # a gemm's 0 was "give M,N,K positive (dims must be positive integers, got (1, 0, 10, 10))"
    line = refused([*KERNEL, "--op", op, f"--dims={dims}"], capsys, f"--dims '{dims}'")
    assert line.endswith(f"each size must be a positive whole number, got {got}"), line


@pytest.mark.parametrize(
    ("name", "gpu_id"),
    [("A100 SXM4 80GB", "a100-sxm4-80gb"), ("T4", "t4"), ("a100-sxm-80gb", "a100-sxm4-80gb")],
)
def test_a_gpu_named_as_the_catalog_lists_it_gets_its_id_suggested(
    name: str, gpu_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `tilesim list gpus` prints "a100-sxm4-80gb     A100 SXM4 80GB": the second column was
    # refused with the whole id list and no pointer
    argv = [*KERNEL[:2], "--gpu", name, "--op", "gemm", "--dims", "8,8,8"]
    refused(argv, capsys, f"unknown GPU {name!r} (did you mean {gpu_id!r}?)")


def test_a_negative_min_bytes_is_refused_and_degrade_help_says_scales_multiply(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["collective-check", "--data", "/nonexistent", "--min-bytes", "-1"]
    refused(argv, capsys, "--min-bytes -1: give a finite size in bytes, 0 or more")
    assert main(["collective", "--help"]) == 0
    assert "scales of one link multiply" in " ".join(capsys.readouterr().out.split())


def test_plot_of_a_folder_that_does_not_exist_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo"
    refused(["plot", str(missing)], capsys, f"{missing}: no such folder or file")


@pytest.mark.parametrize(
    "argv",
    [
        "predict --model llama2-70b --gpu a100-pcie-80gb --batch 1 --seq 128 --mode train --json",
        "serve --model llama2-70b --gpu a100-pcie-80gb --batch 1 --prompt 128 --gen 4",
    ],
)
def test_a_forecast_that_does_not_fit_prints_and_exits_1(
    argv: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Llama-2 70B's weights alone overflow an 80 GiB A100: `predict` and `serve` printed the
    forecast and exited 0 where `simulate` of a layout that does not fit exits 1; serve's text
    said ``fits=False`` as a Python bool."""
    assert main(argv.split()) == 1
    out = capsys.readouterr().out
    assert out.strip() and "fits=" not in out
    if argv.startswith("serve"):
        assert "does NOT fit: the weights alone do not fit in GPU memory" in out
    else:
        assert json.loads(out)["fits"] is False


@pytest.mark.parametrize(
    ("key", "value"),
    [("hidden_size", 10**12), ("num_layers", 10**9), ("ffn_hidden_size", 2**23)],
)
def test_a_model_size_past_any_transformer_is_refused(
    key: str, value: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo'd model file (hidden_size = 1e12) was forecast in 10^23 seconds; it is refused
    naming the key and the largest size accepted."""
    sizes = {"num_layers": 2, "hidden_size": 1024, "ffn_hidden_size": 4096, "vocab_size": 50257}
    sizes[key] = value
    body = "".join(f"{k} = {v}\n" for k, v in sizes.items())
    model = tmp_path / "typo.toml"
    model.write_text(f'architecture = "gpt2"\nnum_heads = 16\n{body}')
    argv = f"predict --model {model} --gpu a100-pcie-80gb --batch 1 --seq 128 --mode inf"
    assert main(argv.split()) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert "\n" not in err and f"'{key}'" in err and "use at most" in err
