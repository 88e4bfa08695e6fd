"""Hostile and mistaken input to the ``tilesim`` command line, round two: one line on stderr
naming the field or flag and the fix, exit code 2, no traceback, nothing written (found by a
second hostile-input audit of every command)."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from forecast.gpus import CATALOG_DIR, GPUError, load_gpu
from simulator.cli import main
from simulator.errors import ConfigError
from simulator.space import find_scenario
from simulator.sweep import _check_reachable
from tests.support import edited, one_line_refusal
from topologies.catalog import NETWORKS_DIR, SERVERS_DIR, load_network, load_server
from topologies.spec import TopologyError

TINY = find_scenario("tiny-gpt-8gpu")
GPU = CATALOG_DIR / "a100-sxm4-80gb.toml"
SERVER = SERVERS_DIR / "dgx-a100.toml"
NETWORK = NETWORKS_DIR / "ib-hdr.toml"


def _one_line(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    return one_line_refusal(capsys.readouterr().err, *needles)


# --- 1. a GPU, server or network file's numbers are numbers ----------------------------------

# (field, value as written in the file): pydantic's lax mode read each as a number; a quoted
# "108" ran as 108 SMs, `true` as a rate of 1.0 (an A100 of 1 byte/s of HBM forecast a bmm at
# 10^7 s), and 108.0 SMs passed as 108 while 108.5 was refused
GPU_NOT_NUMBERS = [
    ("num_sms", '"108"'),
    ("num_sms", "true"),
    ("num_sms", "108.0"),
    ("fp32_lanes_per_sm", '"64"'),
    ("boost_clock_hz", '"1.41e9"'),
    ("hbm_bw_bytes_per_s", "true"),
    ("l2_bytes", "false"),
    ("tdp_w", '"400"'),
]


@pytest.mark.parametrize(("field", "value"), GPU_NOT_NUMBERS)
def test_a_gpu_file_number_written_as_text_or_boolean_is_refused(
    field: str, value: str, tmp_path: Path
) -> None:
    path = edited(GPU, field, value, tmp_path / "gpu.toml")
    with pytest.raises(GPUError, match=rf"field '{field}' must be a positive"):
        load_gpu(path)


@pytest.mark.parametrize("value", ['"3.12e14"', "true"])
def test_a_gpu_peak_written_as_text_or_boolean_is_refused(value: str, tmp_path: Path) -> None:
    """``[peak_flops_per_s] bf16 = "3.12e14"`` was read as the number; ``true`` as 1 FLOP/s."""
    text, n = re.subn(r"(?m)^bf16 = [^#\n]*", f"bf16 = {value} ", GPU.read_text(), count=1)
    assert n == 1
    path = tmp_path / "gpu.toml"
    path.write_text(text)
    with pytest.raises(GPUError, match=r"field 'peak_flops_per_s.bf16' must be a positive"):
        load_gpu(path)


def test_a_quoted_gpu_number_is_one_line_naming_field_and_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = edited(GPU, "num_sms", '"108"', tmp_path / "gpu.toml")
    argv = ["kernels", "predict", "--gpu", str(path), "--op", "bmm", "--dims", "16,512,64,512"]
    assert main([*argv, "--json"]) == 2
    _one_line(capsys, "num_sms", '"108"', "no quotes")
    assert capsys.readouterr().out == ""


# server/network fields, each written as text, a boolean or a float where a count is meant
TOPOLOGY_NOT_NUMBERS = [
    (SERVER, "gpus_per_node", '"8"'),
    (SERVER, "gpus_per_node", "true"),
    (SERVER, "gpus_per_node", "8.0"),
    (SERVER, "max_nodes", "true"),
    (SERVER, "launch_latency_s", '"20e-6"'),
    (SERVER, "efficiency", "true"),  # [intra]
    (NETWORK, "bw_bytes_per_s_per_dir", '"2.5e10"'),
    (NETWORK, "latency_s", '"7e-6"'),
]


@pytest.mark.parametrize(("src", "field", "value"), TOPOLOGY_NOT_NUMBERS)
def test_a_server_or_network_number_written_as_text_or_boolean_is_refused(
    src: Path, field: str, value: str, tmp_path: Path
) -> None:
    """A quoted server or link number was read as the number; ``efficiency = true`` as 1.0
    (a link at its full line rate) and ``max_nodes = true`` as one node."""
    path = edited(src, field, value, tmp_path / f"{src.stem}-{field}.toml")
    load = load_server if src == SERVER else load_network
    with pytest.raises(TopologyError, match=rf"field '([a-z]+\.)?{field}' must be a"):
        load(str(path))


def test_a_server_file_that_is_not_utf8_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was a UnicodeDecodeError traceback (the GPU and scenario loaders caught it)."""
    path = tmp_path / "server.toml"
    path.write_bytes(b'name = "\xff\xfe"\n')
    argv = ["collective", "--op", "all-reduce", "--bytes", "1e9", "--gpus", "16"]
    assert main([*argv, "--cluster", str(path)]) == 2
    _one_line(capsys, str(path), "utf-8")


# --- 2. --data that nothing reads ------------------------------------------------------------

PREDICT = ["predict", "--gpu", "a100-sxm4-80gb", "--batch", "1", "--seq", "128", "--mode", "inf"]


@pytest.mark.parametrize("model", ["tiny-gpt", "llama3-8b"])
def test_predict_refuses_a_data_folder_a_catalog_model_does_not_read(
    model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a NeuSight model name is read from --data (its models/NAME.json); a catalog model
    and every GPU ignored it, so a folder of the user's own device sheets (or a misspelt
    folder that does not exist) ran the catalog's numbers without a word."""
    data = tmp_path / "no-such-folder"
    assert main([*PREDICT, "--model", model, "--data", str(data), "--json"]) == 2
    _one_line(capsys, f"--data {data}", "leave out --data", f"--model {model}")


def test_serve_refuses_a_data_folder_a_catalog_model_does_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--model", "tiny-gpt", "--gpu", "a100-sxm4-80gb", "--batch", "1"]
    assert main([*argv, "--prompt", "8", "--gen", "2", "--data", str(tmp_path), "--json"]) == 2
    _one_line(capsys, f"--data {tmp_path}", "leave out --data")


def test_predict_runs_refuses_a_data_folder_no_line_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs.jsonl"
    line = '{"model": "tiny-gpt", "gpu": "a100-sxm4-80gb", "batch": 1, "seq": 128, "mode": "inf"}'
    runs.write_text(line + "\n")
    assert main(["predict", "--runs", str(runs), "--data", str(tmp_path)]) == 2
    _one_line(capsys, "--data", "no line of --runs")
    assert capsys.readouterr().out == ""


def test_a_neusight_model_name_still_reads_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one thing --data is for: a NeuSight model name is looked up in DATA/models."""
    assert main([*PREDICT, "--model", "gpt2_large", "--data", str(tmp_path), "--json"]) == 2
    _one_line(capsys, "unknown model 'gpt2_large'", str(tmp_path / "models"))


# --- 3. simulate checks the scenario's [sweep] as sweep does ---------------------------------


@pytest.mark.parametrize(
    ("assignment", "needle"),
    [
        ("sweep.tpp=[1, 2]", "sweep: unknown keys ['tpp']"),
        ('sweep.tp=["2"]', "sweep.tp"),
        ("sweep.world_size=[0]", "sweep.world_size"),
        ("sweep.train_tokens=[-1]", "sweep.train_tokens"),
    ],
)
def test_simulate_refuses_a_sweep_table_the_sweep_refuses(
    assignment: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """simulate ran [run] and let each of these pass; `tilesim sweep` of the same file then
    failed on it. Both now name it the same way (sweep_table.check_sweep)."""
    assert main(["simulate", str(TINY), "--set", assignment, "--json"]) == 2
    _one_line(capsys, needle)
    assert capsys.readouterr().out == ""


# --- 4. --address where no Ray listens -------------------------------------------------------


def _server(reply: bytes) -> tuple[int, Callable[[], None]]:
    """A local TCP server that answers every connection with ``reply`` (b"": stays silent);
    its port, and a function that stops it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                if reply:
                    conn.sendall(reply)
                stop.wait(2.0)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        thread.join()
        sock.close()

    return sock.getsockname()[1], close


@pytest.mark.parametrize("reply", [b"HTTP/1.0 400 Bad request\r\n\r\n", b""])
def test_an_address_where_something_else_listens_is_refused_at_once(reply: bytes) -> None:
    """A web server on --address: ray.init retried it for two minutes, printing warnings
    (measured 2 min 4 s against `python -m http.server`), before its own error. A Ray head's
    GCS is a gRPC server and answers an HTTP/2 preface with a SETTINGS frame (RFC 9113
    section 3.4): anything else is not Ray."""
    port, close = _server(reply)
    try:
        with pytest.raises(ConfigError, match=rf"--address 127.0.0.1:{port}: .* not Ray"):
            _check_reachable(f"127.0.0.1:{port}", timeout_s=0.5)
    finally:
        close()


def test_a_grpc_like_answer_passes_the_probe() -> None:
    """The probe's other side: an HTTP/2 server's first frame, an empty SETTINGS frame
    (length 0, type 4, flags 0, stream 0), is taken for a Ray head (the GCS of a local
    ``ray.init`` answered exactly with a SETTINGS frame)."""
    port, close = _server(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    try:
        _check_reachable(f"127.0.0.1:{port}", timeout_s=2.0)
    finally:
        close()


def test_a_ray_client_address_where_nothing_listens_is_one_line_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ray://127.0.0.1:1 waited 30 s for Ray's client to time out, then printed a
    UserWarning and the error: two lines. Port 1 (tcpmux) has no listener here."""
    out = tmp_path / "out"
    argv = ["sweep", str(TINY), "--address", "ray://127.0.0.1:1", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 2
    _one_line(capsys, "--address ray://127.0.0.1:1", "cannot connect")
    assert not out.exists()


# --- explored: a folder given where a file is meant ------------------------------------------


@pytest.mark.parametrize("name", ["model.toml", "config.json"])
def test_a_model_folder_is_named_a_folder_not_missing(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--model DIR.toml`` said the model file "does not exist" when a folder was there (the
    GPU loader already said "is a folder; give the file")."""
    folder = tmp_path / name
    folder.mkdir()
    assert main([*PREDICT, "--model", str(folder), "--json"]) == 2
    _one_line(capsys, f"model file {folder} is a folder", "give the file")
