"""Hostile input to the ``tilesim`` command line: one line on stderr naming the field and the
fix, exit code 2, no traceback, before any work; a huge value is refused fast instead of
running for minutes (found by a hostile-input audit of every command, each run in a
subprocess with a timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.space import find_scenario
from tests.support import edited, one_line_refusal

REPO = Path(__file__).resolve().parents[1]
TINY = find_scenario("tiny-gpt-8gpu")
SERVER = REPO / "topologies" / "data" / "servers" / "dgx-a100.toml"
NETWORK = REPO / "topologies" / "data" / "networks" / "ib-hdr.toml"
# every case below is refused before the step is simulated: a few seconds of imports; the
# unfixed cases ran for minutes (or until killed for memory), so a timeout is the failure
TIMEOUT_S = 90


def _tilesim(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "simulator", *argv],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"tilesim {' '.join(argv)} ran past {TIMEOUT_S} s instead of refusing")


def _refused(p: subprocess.CompletedProcess[str], *needles: str, code: int = 2) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    return one_line_refusal(p.stderr, *needles)


# --- catalogs: an infinite link rate or latency ------------------------------------------


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_an_infinite_network_latency_is_refused_not_printed_as_infinity(
    value: str, tmp_path: Path
) -> None:
    """``latency_s = inf`` in a network file printed ``"time_s": Infinity`` (not JSON) and
    a simulate step of NaN seconds; a latency is a finite number of seconds (>= 0)."""
    net = edited(NETWORK, "latency_s", value, tmp_path / "net.toml")
    p = _tilesim(
        "collective", "--op", "all-reduce", "--bytes", "1e9", "--gpus", "16",
        "--cluster", "dgx-a100", "--network", str(net), "--json",
    )  # fmt: skip
    _refused(p, "link.latency_s", str(net))


def test_an_infinite_link_bandwidth_is_refused(tmp_path: Path) -> None:
    """An NVLink of infinite bytes per second priced every intra-node collective at its
    latency alone; the bandwidth is a finite rate per direction."""
    server = edited(SERVER, "bw_bytes_per_s_per_dir", "inf", tmp_path / "server.toml")
    p = _tilesim("simulate", str(TINY), "--set", f'cluster.server="{server}"', "--json")
    _refused(p, "intra.bw_bytes_per_s_per_dir", str(server))


# --- huge values: refused fast, naming the key -------------------------------------------


@pytest.mark.parametrize("experts", [2**63, 10**6])
def test_a_huge_expert_count_is_refused(experts: int) -> None:
    """2^63 experts was an OverflowError traceback (one FFN op per expert in a Python list),
    10^6 ran past a minute. 2^16 experts (0.1 s a step) is far beyond any MoE model
    (Switch-C: 2,048 experts, Fedus et al. 2021, table 9) and is the cap."""
    p = _tilesim("simulate", str(TINY), "--set", f"model.num_experts={experts}", "--json")
    _refused(p, "num_experts", "65536")


def test_a_huge_bucket_count_is_refused() -> None:
    """run.buckets = 10^6 built a graph of about 4 million nodes and ran past a minute
    (10^5: 56 s). Nodes of tiny-gpt's step (pp 2, 1 chunk, 16 / (2 x 2) = 4 micro-batches):
    per stage and chunk 2 x 4 tasks + up to 2 x buckets bucket pieces and reductions, + 2
    (optimizer, gather) per stage = 2 x (8 + 2 x 10^6) + 4 > the 200,000 simulated."""
    p = _tilesim("simulate", str(TINY), "--set", "run.buckets=1000000", "--json")
    _refused(p, "run.buckets", "200,000")


def test_a_step_graph_of_minutes_is_refused() -> None:
    """global_batch_size 10^6 on tiny-gpt: 10^6 / (micro-batch 2 x dp 2) = 250,000
    micro-batches x 2 stages x 2 (forward, backward) = 1,000,000 tasks, under the old cap of
    2,000,000 and more than a minute to simulate (100,000 nodes take 10-20 s here)."""
    p = _tilesim(
        "simulate", str(TINY), "--set", "training.global_batch_size=1000000", "--json"
    )  # fmt: skip
    _refused(p, "250,000 micro-batches", "training.global_batch_size")


def test_a_sweep_prunes_layouts_whose_graph_is_too_big(tmp_path: Path) -> None:
    """A sweep simulated such layouts for minutes; it prunes them, naming the rule, and with
    none left says so (exit 2, as for any sweep without a valid layout) and writes nothing.
    Fewest micro-batches of the tiny sweep: 10^7 / (micro-batch 2 x dp 8) = 625,000."""
    out = tmp_path / "out"
    p = _tilesim(
        "sweep", str(TINY), "--set", "training.global_batch_size=10000000", "--serial",
        "--no-progress", "--out", str(out),
    )  # fmt: skip
    _refused(p, "no valid layout", "graph", code=2)
    assert not out.exists()


# --- output paths that cannot be written: refused before the work ------------------------


def _unwritable(folder: str) -> Path:
    """A folder of the system where even root cannot create a file (/proc, /sys on Linux)."""
    path = Path(folder)
    if not path.is_dir():
        pytest.skip(f"no {folder} on this system")
    try:
        with open(path / "tilesim-probe", "w"):
            pass
    except OSError:
        return path
    os.remove(path / "tilesim-probe")
    pytest.skip(f"{folder} is writable here")


@pytest.mark.parametrize("folder", ["/proc", "/sys"])
def test_a_trace_in_an_unwritable_folder_is_refused_before_the_step(folder: str) -> None:
    """/sys: a PermissionError traceback after the step was simulated; /proc: "[Errno 2] No
    such file or directory: '/proc/.partial-...'", naming neither --trace nor a fix."""
    trace = _unwritable(folder) / "step.json"
    p = _tilesim("simulate", str(TINY), "--trace", str(trace), "--json")
    _refused(p, f"--trace {trace}", "give another path")
    assert p.stdout == ""  # refused before the step, not after it


def test_a_validation_report_in_an_unwritable_folder_is_refused_before_the_work() -> None:
    """``kernels validate --out /sys/x.json`` ran the validation, then a traceback: `os.access`
    says yes to root, so the folder is probed by creating a file in it."""
    out = _unwritable("/sys") / "validation.json"
    p = _tilesim("kernels", "validate", "--no-logo", "--out", str(out))
    _refused(p, f"--out {out}", "give another path")
