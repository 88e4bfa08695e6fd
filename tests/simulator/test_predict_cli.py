"""``tilesim predict``: JSON keys, --runs JSONL with a bad line, exit 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main

KEYS = {"e2e_ms", "fw_ms", "bw_ms", "optimizer_ms", "by_family_ms", "memory_gib", "fits"}
BASE = ["predict", "--model", "tiny-gpt", "--gpu", "v100-pcie-32gb", "--batch", "2", "--seq", "64"]


def test_predict_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--mode", "train", "--latency-model", "roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == KEYS
    assert out["e2e_ms"] == pytest.approx(out["fw_ms"] + out["bw_ms"])
    assert out["optimizer_ms"] > 0


def test_inference_e2e_is_forward(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--mode", "inf", "--latency-model", "roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["e2e_ms"] == out["fw_ms"] and out["bw_ms"] == 0


@pytest.mark.parametrize(
    "bad",
    [
        ["--model", "nope"],
        ["--gpu", "nope"],
        ["--batch", "0"],
        ["--framework", "deepspeed"],
    ],
)
def test_bad_input_exits_2(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    args = [*BASE, "--mode", "inf", "--latency-model", "roofline", "--json"]
    for i in range(0, len(bad), 2):
        if bad[i] in args:
            args[args.index(bad[i]) + 1] = bad[i + 1]
        else:
            args += bad[i : i + 2]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("tilesim: error:") and "Traceback" not in err


def test_runs_jsonl_with_one_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = {"model": "tiny-gpt", "gpu": "t4", "batch": 1, "seq": 32, "mode": "inf"}
    lines = [json.dumps(good), json.dumps({**good, "gpu": "zzz"}), json.dumps({**good, "seq": 64})]
    runs = tmp_path / "runs.jsonl"
    runs.write_text("\n".join(lines) + "\n")
    assert main(["predict", "--runs", str(runs), "--latency-model", "roofline", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "tilesim: 1 of 3 runs failed: line 2\n"
    out = [json.loads(x) for x in captured.out.splitlines()]
    assert len(out) == 3
    assert set(out[0]) == {"line", *KEYS} and set(out[2]) == {"line", *KEYS}
    assert [o["line"] for o in out] == [1, 2, 3] and "zzz" in out[1]["error"]


def test_runs_jsonl_bad_values_are_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {"model": "tiny-gpt", "gpu": "t4", "batch": 1, "seq": 32, "mode": "inf"}
    bad = [{"batch": True}, {"batch": "2"}, {"batch": 10**20}, {"seq": 1.5}]
    runs = tmp_path / "runs.jsonl"
    runs.write_text("\n".join(json.dumps({**good, **b}) for b in [*bad, {}]) + "\n")
    assert main(["predict", "--runs", str(runs), "--latency-model", "roofline", "--json"]) == 1
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [o["line"] for o in out] == [1, 2, 3, 4, 5]
    assert "batch" in out[0]["error"] and "2^40" in out[2]["error"]
    assert set(out[4]) == {"line", *KEYS}


@pytest.mark.parametrize("content", [None, b"\xff\xfe{", "dir"])
def test_unreadable_runs_file_is_one_line_naming_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | str | None
) -> None:
    runs = tmp_path / "runs.jsonl"
    if content == "dir":
        runs.mkdir()
    elif isinstance(content, bytes):
        runs.write_bytes(content)
    assert main(["predict", "--runs", str(runs), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tilesim: error: --runs") and err.count("\n") == 1


def _write_trace(path: Path, rows: list[dict[str, str]]) -> None:
    import csv
    import gzip

    cols = ["op", "target", "meta", "input_shapes", "output_shape"]
    cols += ["fw_latency", "bw_latency", "acc_latency"]
    with gzip.open(path, "wt", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows({c: r.get(c, "") for c in cols} for r in rows)


def _module(path: str, cls: str) -> str:
    """An FX ``meta`` cell: the module stack down to ``path`` (parents first, as traced)."""
    parts = path.split(".")
    stack = [f"('{'.'.join(parts[: i + 1])}', <class 'x.Parent'>)" for i in range(len(parts) - 1)]
    stack.append(f"('{path}', <class 'torch.nn.modules.x.{cls}'>)")
    return f"{{'nn_module_stack': OrderedDict([{', '.join(stack)}])}}"


def test_trace_sums_layer_zero_rows_per_family(tmp_path: Path) -> None:
    """NeuSight's recipe: layer-0 rows x num_layer + the other rows, all three latency
    columns, each row in the family of the kernel it launches."""
    from simulator.label_trace import HOST, trace_family_ms

    fn = "call_function"
    rows = [
        # outside the layers: counted once
        {
            "op": "call_module",
            "meta": _module("bert.embeddings.word", "Embedding"),
            "input_shapes": "[[8, 512]]",
            "fw_latency": "1.0",
            "bw_latency": "2.0",
            "acc_latency": "0.5",
        },
        # layer 0: x 24
        {
            "op": "call_module",
            "meta": _module("bert.encoder.layer.0.q", "Linear"),
            "input_shapes": "[[8, 512, 1024]]",
            "output_shape": "(8, 512, 1024)",
            "fw_latency": "3.0",
            "bw_latency": "4.0",
            "acc_latency": "1.0",
        },
        {
            "op": fn,
            "target": "<built-in function add>",
            "meta": "'bert.encoder.layer.0'",
            "input_shapes": "[[1], [1]]",
            "fw_latency": "0.25",
            "bw_latency": "0",
            "acc_latency": "0",
        },
        {
            "op": fn,
            "target": "<built-in method matmul of type object at 0x7f>",
            "meta": "'bert.encoder.layer.0'",
            "input_shapes": "[[8, 16, 512, 64], [8, 16, 64, 512]]",
            "fw_latency": "2.0",
            "bw_latency": "0",
            "acc_latency": "0",
        },
        {
            "op": fn,
            "target": "<function gelu at 0x7f>",
            "meta": "'bert.encoder.layer.0'",
            "input_shapes": "[[8, 512, 4096]]",
            "fw_latency": "0.5",
            "bw_latency": "0.5",
            "acc_latency": "0",
        },
        # not layer 0 ("layer.10"): counted once
        {
            "op": "call_method",
            "target": "contiguous",
            "meta": "'bert.encoder.layer.10'",
            "input_shapes": "[[8, 512, 1024]]",
            "fw_latency": "100.0",
            "bw_latency": "0",
            "acc_latency": "0",
        },
    ]
    path = tmp_path / "run.csv.gz"
    _write_trace(path, rows)
    fams = trace_family_ms(path, 24)
    assert fams == pytest.approx(
        {
            "memory": 3.5 + 100.0,
            "linear": 8.0 * 24,
            HOST: 0.25 * 24,
            "bmm": 2.0 * 24,
            "elementwise": 1.0 * 24,
        }
    )
    assert trace_family_ms(tmp_path / "absent.csv.gz", 24) is None
    # num_layer 0: a full-model trace (Switch's), every row once
    assert trace_family_ms(path, 0) == pytest.approx(
        {"memory": 103.5, "linear": 8.0, HOST: 0.25, "bmm": 2.0, "elementwise": 1.0}
    )
    # the same trace by pass: forward; backward + AccumulateGrad (as bwall_latency times it)
    from simulator.label_trace import trace_pass_ms

    layer_fw, layer_bw = 3.0 + 0.25 + 2.0 + 0.5, 4.0 + 1.0 + 0.5
    assert trace_pass_ms(path, 24) == pytest.approx(
        {"forward": layer_fw * 24 + 1.0 + 100.0, "backward": layer_bw * 24 + 2.5}
    )
    assert trace_pass_ms(path, 0) == pytest.approx(
        {"forward": layer_fw + 101.0, "backward": layer_bw + 2.5}
    )
    assert trace_pass_ms(tmp_path / "absent.csv.gz", 24) is None


@pytest.mark.parametrize(
    ("op", "target", "shapes", "family"),
    [
        (
            "call_function",
            "<built-in method addmm of type object at 0x7f>",
            "[[3840], [1024, 1280], [1280, 3840]]",
            "linear",
        ),
        (
            "call_function",
            "<built-in method matmul of type object at 0x7f>",
            "[[2, 1024, 1280], [1280, 3840]]",
            "linear",
        ),
        (
            "call_function",
            "<built-in method bmm of type object at 0x7f>",
            "[[64, 2048, 64], [64, 64, 2048]]",
            "bmm",
        ),
        (
            "call_function",
            "<built-in method softmax of type object at 0x7f>",
            "[[8, 16, 512, 512]]",
            "softmax",
        ),
        (
            "call_function",
            "<built-in method where of type object at 0x7f>",
            "[[1, 1, 1024, 1024], [1, 20, 1024, 1024], [1]]",
            "memory",
        ),
        ("call_method", "view", "[[8, 512, 1024], [1]]", "host"),
        ("call_function", "<built-in function getitem>", "[[1]]", "host"),
        ("call_function", "<built-in function mul>", "[[1], [1]]", "host"),
        ("call_function", "<built-in function truediv>", "[[8, 16, 512, 512], [1]]", "elementwise"),
        ("placeholder", "input_ids", "[]", "host"),
    ],
)
def test_trace_rows_go_to_the_family_of_their_kernel(
    op: str, target: str, shapes: str, family: str
) -> None:
    from simulator.label_trace import row_family

    row = {"op": op, "target": target, "meta": "{}", "input_shapes": shapes}
    assert row_family(row) == family


def test_trace_kernels_read_dims_in_the_kernel_tables_convention(tmp_path: Path) -> None:
    """A linear layer as (1, M, N, K): input (M, N), N -> K features; a layer norm or softmax
    as (rows, width); element-wise rows are not in the tables' families."""
    from simulator.label_trace import trace_kernels

    rows = [
        {
            "op": "call_module",
            "meta": _module("bert.encoder.layer.0.ffn", "Linear"),
            "input_shapes": "[[16, 512, 1024]]",
            "output_shape": "(16, 512, 4096)",
            "fw_latency": "6.0",
        },
        {
            "op": "call_function",
            "target": "<built-in method addmm of type object at 0x7f>",
            "meta": "{}",
            "input_shapes": "[[3840], [1024, 1280], [1280, 3840]]",
            "fw_latency": "0.75",
        },
        {
            "op": "call_function",
            "target": "<function gelu at 0x7f>",
            "meta": "{}",
            "input_shapes": "[[16, 512, 4096]]",
            "fw_latency": "1.0",
        },
        {
            "op": "call_module",
            "meta": _module("bert.encoder.layer.0.ln", "LayerNorm"),
            "input_shapes": "[[16, 512, 4096]]",
            "fw_latency": "0.5",
        },
    ]
    path = tmp_path / "run.csv.gz"
    _write_trace(path, rows)
    assert trace_kernels(path) == [
        ("linear", (1, 8192, 1024, 4096), 6.0),
        ("linear", (1, 1024, 1280, 3840), 0.75),
        ("layernorm", (8192, 4096), 0.5),
    ]


def test_framework_attribution_counts_backward_kernels_with_their_op() -> None:
    """A softmax's backward multiply and a linear layer's gradient accumulation (element-wise
    kernels) count as softmax and linear time, as a per-op trace counts them; nothing is
    lost or counted twice."""
    from simulator.e2e import NO_OVERHEADS, family_times_s
    from simulator.models import load_model
    from simulator.opgraph import Workload, build_ops

    graph = build_ops(load_model("tiny-gpt"), Workload(batch=1, seq=128, mode="train"))
    table = dict.fromkeys(graph.kernels(), 1e-3)
    by_kernel = family_times_s(graph, table, NO_OVERHEADS)
    by_op = family_times_s(graph, table, NO_OVERHEADS, by_op=True)
    assert sum(by_op.values()) == pytest.approx(sum(by_kernel.values()))
    assert by_op["softmax"] > by_kernel["softmax"]
    assert by_op["linear"] > by_kernel["linear"]
    assert by_op["elementwise"] < by_kernel["elementwise"]


def test_validate_e2e_draws_its_figure(tmp_path: Path) -> None:
    from simulator.models import DEFAULT_DATA_DIR

    if not (DEFAULT_DATA_DIR / "labels").is_dir():
        pytest.skip(f"NeuSight labels not found at {DEFAULT_DATA_DIR} (clone without ../shared)")
    out = tmp_path / "e2e.png"
    assert main(["validate", "e2e", "--markdown", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("kind", ["tensor-core", "foo"])
def test_a_latency_model_that_cannot_cover_a_model_is_refused(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """tensor-core was accepted and then failed on the first element-wise kernel."""
    argv = ["predict", "--model", "tiny-gpt", "--gpu", "a100-sxm4-80gb", "--batch", "1"]
    argv += ["--seq", "64", "--mode", "train", "--dtype", "bf16", "--latency-model", kind]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--latency-model {kind}:" in err and "auto, tile-mlp, roofline" in err
    assert err.count("\n") == 1


def test_runs_jsonl_a_run_that_does_not_fit_exits_1_and_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As one run of ``predict`` does: the forecast is printed, the exit code is 1."""
    good = {"model": "tiny-gpt", "gpu": "t4", "batch": 1, "seq": 32, "mode": "inf"}
    big = {"model": "llama3-8b", "gpu": "t4", "batch": 8, "seq": 4096, "mode": "train"}
    runs = tmp_path / "runs.jsonl"
    runs.write_text("\n".join(json.dumps(r) for r in (good, big)) + "\n")
    assert main(["predict", "--runs", str(runs), "--latency-model", "roofline", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "tilesim: 1 of 2 runs do not fit in GPU memory: line 2\n"
    out = [json.loads(x) for x in captured.out.splitlines()]
    assert [o["fits"] for o in out] == [True, False] and out[1]["e2e_ms"] > 0
    runs.write_text(json.dumps(good) + "\n")
    assert main(["predict", "--runs", str(runs), "--latency-model", "roofline", "--json"]) == 0
