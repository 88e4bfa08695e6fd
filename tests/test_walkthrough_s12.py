"""A new user's walk through the forecast-side commands (`kernels predict|eval|table|plot`,
`validate e2e --plot`, `simulate --trace`) as an ML-infrastructure planner reads them. Each
test names what the walk found; no forecast number changed, only how it is printed."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

import simulator.e2e_plots as e2e_plots
import simulator.kernel_plots as kernel_plots
from forecast.dataset import load_measurements
from forecast.gpus import load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.report import bytes_text, duration_text, kernel_header
from forecast.roofline import RooflineModel
from simulator.cli import main
from simulator.execgraph import task_label
from tests.support import drawn, one_line_refusal

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
NEUSIGHT = ROOT.parent / "shared" / "data" / "neusight"


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _field(out: str, label: str) -> str:
    """The text after ``label`` on its line of ``kernels predict``'s output."""
    line = next(x for x in out.splitlines() if x.strip().startswith(label))
    return line.strip()[len(label) :].strip()


def _has_line(out: str, label: str) -> bool:
    return any(x.strip().startswith(label) for x in out.splitlines())


def _seconds(text: str) -> float:
    value, unit = text.split()[:2]
    return float(value.replace(",", "")) * {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]


# --- kernels predict ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.99996, "1 s"),  # rounded first: not "1000 ms"
        (0.012345678, "12.35 ms"),
        (2.5e-6, "2.5 us"),
        (5e-10, "0.5 ns"),
        (1234.5, "1,234 s"),
    ],
)
def test_durations_print_four_significant_figures_with_a_unit(seconds: float, text: str) -> None:
    """`kernels predict` printed "0.0030 ms" for a 3 us kernel (two figures) and "1500.1234
    ms" for a 1.5 s one (eight); the step of `simulate` mixed s and ms on one line."""
    assert duration_text(seconds) == text


def test_bytes_print_with_a_decimal_prefix() -> None:
    assert [bytes_text(x) for x in (8, 98_304, 201_326_592, 1.935e12)] == [
        "8 B",
        "98.3 kB",
        "201.3 MB",
        "1.935 TB",
    ]


def test_gemm_echoes_its_m_n_k_and_explains_the_forecast(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--op gemm --dims 1000,3000,777` printed "bmm (1, 1000, 777, 3000) fp32 on ...: 0.2799
    ms": the sizes permuted, no TFLOP/s, no word of the model that priced it or its tiles."""
    argv = ["kernels", "predict", "--gpu", "a100-pcie-80gb", "--op", "gemm"]
    argv += ["--dims", "1000,3000,777"]
    code, out, _ = _run(capsys, *argv)
    assert code == 0
    assert out.splitlines()[0] == (
        "gemm M,N,K=1000,3000,777 (K the reduction) fp32 on a100-pcie-80gb (A100 PCIe 80GB)"
    )
    _, js, _ = _run(capsys, *argv, "--json")
    latency_s = json.loads(js)["latency_s"]
    assert _field(out, "latency") == duration_text(latency_s)
    assert _seconds(_field(out, "latency")) == pytest.approx(latency_s, rel=5e-4)
    tflops = float(_field(out, "compute").split()[0])
    assert tflops == pytest.approx(2 * 1000 * 3000 * 777 / latency_s / 1e12, rel=5e-4)
    assert _field(out, "model").startswith("auto -> tile-mlp: ")
    # the tile line obeys the wave closed form: blocks = ceil(M/rows) ceil(N/cols) split,
    # waves = ceil(blocks / (SMs x resident)); the stored bmm's output is M x N
    tiles = _field(out, "tiles")
    m = re.match(
        r"(\d+)x(\d+) output tiles .*split-K (\d+): ([\d,]+) blocks? in ([\d,]+) wave", tiles
    )
    assert m is not None, tiles
    rows, cols, split, blocks, waves = (int(g.replace(",", "")) for g in m.groups())
    assert blocks == math.ceil(1000 / rows) * math.ceil(3000 / cols) * split
    resident = re.search(r"(\d+) resident per SM", tiles)
    assert resident is not None
    assert waves == math.ceil(blocks / (108 * int(resident.group(1))))
    assert "over 108 SMs" in tiles


def test_row_kernel_shows_one_block_a_row_for_layer_norm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = _run(
        capsys, "kernels", "predict", "--gpu", "a100-pcie-80gb", "--op", "ln", "--dims", "4096,1024"
    )
    assert code == 0 and out.startswith("layernorm B,H=4096,1024 fp32 on a100-pcie-80gb")
    assert "compute" not in out  # a FLOP rate means nothing for a layer norm
    assert "128 threads a block: 4,096 blocks in" in _field(out, "tiles")
    latency_s = _seconds(_field(out, "latency"))
    dram = _field(out, "DRAM")
    assert dram.startswith(bytes_text(4 * (2 * 4096 * 1024 + 2 * 1024)) + " at least")
    printed = float(dram.split(": ")[1].split()[0])
    assert printed == pytest.approx(4 * (2 * 4096 * 1024 + 2 * 1024) / latency_s / 1e9, rel=2e-3)


@pytest.mark.parametrize(
    ("gpu", "op", "dims", "dtype", "route"),
    [
        ("h100-sxm5-80gb", "gemm", "8192,8192,8192", "bf16", "auto -> tensor-core: "),
        ("h200-sxm-141gb", "gemm", "8192,8192,8192", "fp8", "auto -> tensor-core: "),
        ("b200-hgx-180gb", "attention_causal", "32,4096,4096,128", "bf16", "auto -> tensor-core"),
        ("v100-pcie-32gb", "gelu", "8192,4096", "fp16", "auto -> bandwidth: "),
        ("a100-pcie-80gb", "add", "4096,4096", "tf32", "auto -> tile-mlp (run as fp32"),
    ],
)
def test_predict_names_the_model_that_served_the_kernel(
    capsys: pytest.CaptureFixture[str], gpu: str, op: str, dims: str, dtype: str, route: str
) -> None:
    """`--model auto` (the default) routes by dtype and family; the output never said where."""
    argv = ["kernels", "predict", "--gpu", gpu, "--op", op, "--dims", dims, "--dtype", dtype]
    code, out, _ = _run(capsys, *argv)
    assert code == 0 and _field(out, "model").startswith(route)
    assert _has_line(out, "tiles") == route.startswith("auto -> tile-mlp")  # tile-mlp's only


def test_roofline_says_it_has_no_tiles(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["kernels", "predict", "--gpu", "l4", "--op", "softmax", "--dims", "64,1024"]
    code, out, _ = _run(capsys, *argv, "--model", "roofline")
    assert code == 0 and _field(out, "model").startswith("roofline: max(FLOPs / catalog peak")
    assert not _has_line(out, "tiles")


@pytest.mark.parametrize(
    ("gpu", "op", "dims", "dtype"),
    [
        ("a100-sxm4-80gb", "gemm", "8192,8192,8192", "fp8"),  # no fp8 before Ada/Hopper
        ("v100-pcie-32gb", "gelu", "1024,1024", "bf16"),
        ("a100-sxm4-80gb", "attention", "8,512,512,64", "fp32"),  # FA2 is fp16/bf16 only
    ],
)
def test_a_dtype_the_gpu_or_kernel_lacks_names_the_dtype_flag(
    capsys: pytest.CaptureFixture[str], gpu: str, op: str, dims: str, dtype: str
) -> None:
    """fp8 on an A100 read "tilesim: error: dtype fp8: ..." (a field, not the flag to fix)."""
    argv = ["kernels", "predict", "--gpu", gpu, "--op", op, "--dims", dims, "--dtype", dtype]
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    line = one_line_refusal(err, f"--dtype {dtype}: ")
    assert line.startswith(f"tilesim: error: --dtype {dtype}: ") and "use " in line


def test_kernel_header_names_each_size() -> None:
    gpu = load_gpu("l4")
    bmm = KernelSpec(OpFamily.BMM, (8, 512, 64, 512), Dtype.FP32)
    assert kernel_header(bmm, gpu) == "bmm B,M,N,K=8,512,64,512 (N the reduction) fp32 on l4 (L4)"
    gelu = KernelSpec(OpFamily.ELEMENTWISE, (2, 3), Dtype.FP32, "gelu")
    assert kernel_header(gelu, gpu).startswith("elementwise gelu B,H=2,3 fp32")


# --- --help: units and defaults -------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["kernels", "predict"], ["fp32 (default)", "auto (default:", "sizes in elements"]),
        (["kernels", "predict"], ["dropout_backward", "masked_fill"]),  # every op, not "..."
        (["kernels", "eval"], ["(default: tile-mlp", "p90_ape_pct"]),
        (["kernels", "train"], ["(default: ", "neusight"]),
        (["kernels", "validate"], ["(default: ", "validation.json"]),
        (["kernels", "plot"], ["(default: kernels.png)", "(default: "]),
        (["kernels", "table"], ["(default: "]),
        (["validate", "distributed"], ["(default: ", "dev_runs.json"]),
        (["simulate"], ["times in us", "Chrome trace JSON"]),
        (["collective"], ["in bytes", "ceil(gpus / GPUs per server)", "auto (default:"]),
        (["collective-check"], ["in bytes", "1 MiB"]),
        (["collective-plot"], ["(default: busbw.png)"]),
    ],
)
def test_help_gives_units_and_defaults(
    capsys: pytest.CaptureFixture[str], argv: list[str], needles: list[str]
) -> None:
    """`--dtype` and `--model` hid their defaults, `--data` its folder, `--bytes` its unit,
    `--gpus` ended "nodes = ceil", `--op` ended "copy, ..."."""
    code, out, _ = _run(capsys, *argv, "--help")
    text = " ".join(out.split())
    assert code == 0
    for needle in needles:
        assert needle in text, needle


# --- kernels eval and table -----------------------------------------------------------------


def test_eval_names_model_and_gpus_and_flags_in_sample_rows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`kernels eval` printed "bmm n= 10984 MAPE 11.53% median 6.63%": which model, on which
    GPUs, median of what? And the five training GPUs' NeuSight rows are in tile-mlp's
    training data (train and test files alike), which nothing said."""
    csv = tmp_path / "m.csv"
    csv.write_text(
        "OPName,Latency,Device,B,M,N,K,H\n"
        "bmm,0.05,NVIDIA L4,8,256,64,256,\n"
        "bmm,0.07,Tesla T4,8,256,64,256,\n"
    )
    code, out, _ = _run(capsys, "kernels", "eval", "--csv", str(csv))
    lines = out.splitlines()
    assert code == 0
    assert lines[0] == "tile-mlp on 2 rows of 2 GPUs: NVIDIA L4, Tesla T4"
    assert lines[1].startswith("1 of them are training GPUs") and "in-sample" in lines[1]
    assert "|predicted / measured - 1|" in lines[2]
    assert lines[3].split() == ["family", "rows", "mean", "APE", "median", "p90"]
    _, js, _ = _run(capsys, "kernels", "eval", "--csv", str(csv), "--json")
    bmm = json.loads(js)["bmm"]
    row = next(x for x in lines if x.startswith("bmm"))
    assert row.split() == [
        "bmm",
        "2",
        f"{bmm['mape_pct']:.2f}%",
        f"{bmm['median_ape_pct']:.2f}%",
        f"{bmm['p90_ape_pct']:.2f}%",
    ]
    _, out, _ = _run(capsys, "kernels", "eval", "--csv", str(csv), "--model", "roofline")
    assert "training GPUs" not in out  # roofline fits nothing


def test_table_says_what_its_cells_are(capsys: pytest.CaptureFixture[str]) -> None:
    """`kernels table` printed "**5.5** / 29.3" cells with no unit and no legend."""
    code, out, _ = _run(capsys, "kernels", "table")
    assert code == 0
    caption, header = out.splitlines()[:2]
    assert "Mean absolute percentage error (%)" in caption and "**tile-mlp** / roofline" in caption
    assert header.startswith("| GPU | split |")


# --- figures --------------------------------------------------------------------------------


def _measurements(tmp_path: Path) -> Path:
    csv = tmp_path / "m.csv"
    csv.write_text(
        "OPName,Latency,Device,B,M,N,K,H\n"
        "bmm,0.05,NVIDIA L4,8,256,64,256,\n"
        "bmm,0.5,NVIDIA L4,8,1024,64,1024,\n"
        "bmm,0.04,NVIDIA A100 80GB PCIe,8,256,64,256,\n"
        "softmax,0.03,NVIDIA L4,1024,,,,1024\n"
        "softmax,0.02,NVIDIA A100 80GB PCIe,1024,,,,1024\n"
    )
    return csv


def test_kernel_plot_keeps_one_colour_per_series_and_readable_legends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The legends were 6-point text on 6-point markers, axes "measured (ms)", and the title
    said "MAPE in brackets" of numbers in parentheses."""
    kept: list[Figure] = []

    def keep(fig: Figure, path: Path, **_: object) -> Path:
        fig.tight_layout()
        kept.append(fig)
        return path

    monkeypatch.setattr(kernel_plots, "save_figure", keep)
    meas = load_measurements([_measurements(tmp_path)])
    models = {"tile-mlp": RooflineModel(), "roofline": RooflineModel()}
    kernel_plots.plot_predicted_vs_measured(models, meas, tmp_path / "k.png")
    fig = kept[0]
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["bmm", "softmax"]
    colours: dict[str, tuple[float, ...]] = {}
    for ax in panels:
        assert ax.get_xlabel() == "measured latency (ms)"
        assert ax.get_ylabel() == "predicted latency (ms)"
        legend = ax.get_legend()
        assert all(t.get_fontsize() >= 7 for t in legend.get_texts())
        for coll in ax.collections:
            series = str(coll.get_label()).rsplit(":", 1)[0]  # "tile-mlp, NVIDIA L4"
            colour = tuple(coll.get_facecolor()[0][:3]) if len(coll.get_facecolor()) else ()
            assert colours.setdefault(series, colour) == colour  # the same in every panel
    assert len(set(colours.values())) == len(colours) == 4
    assert "mean absolute % error" in fig.get_suptitle()
    assert "MAPE in brackets" not in fig.get_suptitle()


@pytest.mark.skipif(not (NEUSIGHT / "labels").is_dir(), reason="NeuSight labels not present")
def test_e2e_plot_title_writes_plus_minus(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The title read "(dashed: +-12%)"."""
    kept = drawn(monkeypatch, e2e_plots)
    assert main(["validate", "e2e", "--plot", str(tmp_path / "e.png")]) == 0
    capsys.readouterr()
    title = kept[0].get_suptitle()
    assert "±12%" in title and "+-" not in title


@pytest.mark.skipif(not (NEUSIGHT / "labels").is_dir(), reason="NeuSight labels not present")
def test_e2e_plot_marks_the_compiled_runs_in_the_forecast_panel(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The eight torch.compile runs (hf-compile) are crosses in the left panel, named in the
    legend, and absent from the trace panel (they have no trace)."""
    kept = drawn(monkeypatch, e2e_plots)
    assert main(["validate", "e2e", "--plot", str(tmp_path / "e.png")]) == 0
    capsys.readouterr()
    left, right = kept[0].axes
    crosses = [c for c in left.collections if c.get_label().endswith(" compiled")]
    assert sorted(c.get_label() for c in crosses) == ["a100-pcie-40gb compiled", "l4 compiled"]
    assert sum(len(c.get_offsets()) for c in crosses) == 8
    assert not [c for c in right.collections if c.get_label().endswith(" compiled")]
    legend = [t.get_text() for t in right.get_legend().get_texts()]
    assert "l4 compiled" in legend


# --- simulate and its trace -----------------------------------------------------------------


def test_simulate_prints_the_layout_and_every_figure_with_its_unit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`simulate` printed one 250-character line without the layout it simulated, without
    tokens/s (in its JSON), "fits=True" as a Python bool, and the step in s beside the
    optimizer in ms."""
    code, out, _ = _run(capsys, "simulate", str(TINY))
    _, js, _ = _run(capsys, "simulate", str(TINY), "--json")
    row = json.loads(js)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 7
    assert lines[0] == (
        "tiny-gpt-8gpu on 8 x a100-sxm4-80gb, bf16; tp 2, pp 2, dp 2; 4 micro-batches of "
        "2 x 128 tokens per replica, 1f1b schedule"
    )
    assert lines[1].split()[:3] == ["step", *duration_text(row["iteration_s"]).split()]
    assert f"{row['tokens_per_s']:,.0f} tokens/s" in lines[2]
    assert f"MFU {row['mfu']:.1%}" in lines[3] and f"HFU {row['hfu']:.1%}" in lines[3]
    assert lines[4].strip() == f"pipeline  bubble {row['bubble_fraction']:.1%} of forward+backward"
    assert f"tp {duration_text(row['exposed_comm_s']['tp'])}" in lines[5]
    assert lines[6].strip() == (
        f"memory    {row['memory_gib_per_gpu']:.1f} GiB per GPU, fits in its 80.0 GiB of GPU memory"
    )
    assert "fits=" not in out


def test_simulate_names_one_micro_batch_in_the_singular(capsys: pytest.CaptureFixture[str]) -> None:
    """A replica of one micro-batch printed "1 micro-batches of 2 x 128 tokens"."""
    code, out, _ = _run(capsys, "simulate", str(TINY), "--set", "training.global_batch_size=4")
    assert code == 0
    assert "; 1 micro-batch of 2 x 128 tokens per replica" in out.splitlines()[0]


def _trace(tmp_path: Path, *sets: str) -> list[dict[str, Any]]:
    """The trace events of the tiny scenario (``--set`` overrides ``sets``)."""
    trace = tmp_path / "step.json"
    argv = ["simulate", str(TINY), "--json", "--trace", str(trace)]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    events: list[dict[str, Any]] = json.loads(trace.read_text())["traceEvents"]
    return events


def test_trace_is_valid_chrome_trace_with_named_tasks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Events were named "F0 c0", "B3 c0 b1", "D-0-0-2", "A-0"; every stage carried an empty
    "dp-gather" thread (ZeRO-3 gathers now share the dp stream)."""
    events = _trace(tmp_path)
    row = json.loads(capsys.readouterr().out)
    complete = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert complete and {e["ph"] for e in events} == {"X", "M"}
    for e in complete:
        assert isinstance(e["ts"], float) and isinstance(e["dur"], float) and e["dur"] > 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    used = {(e["pid"], e["tid"]) for e in complete}
    named = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    assert used == named  # a name for every thread with work, and no empty thread
    assert {e["args"]["name"] for e in meta if e["name"] == "thread_name"} == {
        "compute",
        "pp",
        "dp",
    }
    names = {str(e["name"]) for e in complete}
    assert {"forward mb0", "backward mb2", "optimizer", "dp parameter all-gather"} <= names
    assert {f"backward mb3 part {k}" for k in (1, 2, 3, 4)} <= names  # cut into 4 buckets
    assert {f"dp gradient sync bucket {k}" for k in range(4)} <= names
    assert "pp send forward mb0" in names
    assert not any(re.match(r"^[FBDA]\d|^[DA]-", n) for n in names)
    fwd = next(e for e in complete if e["name"] == "forward mb1" and e["pid"] == 0)
    assert fwd["args"]["task"] == task_label(("F", 0, 0, 1, 0))
    assert fwd["args"]["micro_batch"] == 1 and fwd["args"]["chunk"] == 0
    # one stream runs one task at a time (pp sends excepted: they are latencies that may
    # overlap), and the last task ends with the step
    for pid, tid in used - {(p, 1) for p, _ in used}:
        spans = sorted(
            (e["ts"], e["ts"] + e["dur"]) for e in complete if (e["pid"], e["tid"]) == (pid, tid)
        )
        assert all(b[0] >= a[1] - 1e-6 for a, b in itertools.pairwise(spans))
    end_us = max(e["ts"] + e["dur"] for e in complete)
    assert end_us == pytest.approx(row["iteration_s"] * 1e6, rel=1e-9)


def test_trace_names_the_chunk_only_when_a_stage_holds_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    interleaved = ('run.schedule="1f1b-interleaved"', "run.virtual_stages=2", "model.n_layers=4")
    events = _trace(tmp_path, *interleaved)
    capsys.readouterr()
    names = {str(e["name"]) for e in events if e["ph"] == "X"}
    assert {"forward mb0 chunk 0", "forward mb0 chunk 1"} <= names
    assert "forward mb0" not in names
