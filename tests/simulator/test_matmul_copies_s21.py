"""HF eager's ``torch.matmul`` copies operands that reach it as permuted views (q, k, v split
into heads) into the one-matrix-per-head layout ``bmm`` needs; a per-op trace times those
copies inside the ``matmul`` node (`tests/simulator/test_inventory_trace.py` checks them
against the trace's non-contiguous inputs)."""

from __future__ import annotations

from forecast.gpus import load_gpu
from forecast.kernels import OpFamily
from forecast.predict import load_latency_model
from forecast.stream import stream_table
from simulator.e2e import FITTED, family_times_s
from simulator.opgraph import OpGraph, Phase, Workload, build_ops
from tests.support import SMALL_GPT2

H = SMALL_GPT2.hidden_size
LLAMA: dict[str, object] = {"architecture": "llama", "activation": "swiglu", "norm": "rmsnorm"}


def _copies(g: OpGraph, name: str) -> list[tuple[int, ...]]:
    return [
        op.kernel.dims
        for op in g.ops
        if op.phase is Phase.FORWARD and op.name == name and op.kernel.op == "copy"
    ]


def _graph(update: dict[str, object] | None = None, **run: object) -> OpGraph:
    model = SMALL_GPT2.model_copy(update=update or {})
    return build_ops(model, Workload.model_validate({"batch": 2, "seq": 64, "mode": "inf", **run}))


def test_q_and_k_before_the_scores_and_v_before_the_values() -> None:
    g = _graph()
    assert _copies(g, "layer.qk") == [(128, H), (128, H)]
    assert _copies(g, "layer.av") == [(128, H)]
    bert = _graph({"architecture": "bert"})
    assert len(_copies(bert, "layer.qk")) == 2 and len(_copies(bert, "layer.av")) == 1


def test_a_kv_cache_copies_only_what_is_still_a_permuted_view() -> None:
    """First pass: all three; a later chunk: q only (keys and values come concatenated, laid
    out already); a decode step of one token: nothing (one position needs no permuting)."""
    first = _graph(kv_cache=True)
    assert len(_copies(first, "layer.qk")) == 2 and len(_copies(first, "layer.av")) == 1
    chunk = _graph(kv_cache=True, past=64)
    assert _copies(chunk, "layer.qk") == [(128, H)] and _copies(chunk, "layer.av") == []
    step = _graph(kv_cache=True, past=64, seq=1)
    assert _copies(step, "layer.qk") == [] and _copies(step, "layer.av") == []


def test_llama_copies_v_only_and_not_under_gqa() -> None:
    """Its rotary embedding writes q and k anew (contiguous); GQA's repeat_kv copies k and v
    itself, so matmul copies nothing more."""
    mha = _graph(LLAMA)
    assert _copies(mha, "layer.qk") == [] and _copies(mha, "layer.av") == [(128, H)]
    gqa = _graph({**LLAMA, "num_kv_heads": 2})
    assert _copies(gqa, "layer.qk") == [] and _copies(gqa, "layer.av") == []


def test_the_copies_count_as_matmul_time_as_a_trace_does() -> None:
    """By the framework op they serve (`family_times_s(by_op=True)`), the copies are bmm time;
    by kernel, memory time."""
    g, gpu = _graph(), load_gpu("a100-pcie-40gb")
    table = stream_table(g.kernels(), gpu, load_latency_model("roofline"))
    copies = sum(
        op.count * table[op.kernel]
        for op in g.ops
        if op.name in ("layer.qk", "layer.av") and op.kernel.op == "copy"
    )
    bmm = sum(op.count * table[op.kernel] for op in g.ops if op.kernel.family is OpFamily.BMM)
    by_op = family_times_s(g, table, FITTED, by_op=True)
    assert copies > 0
    assert abs(by_op["bmm"] - (bmm + copies)) <= 1e-12 * by_op["bmm"]
    assert family_times_s(g, table, FITTED)["bmm"] == bmm
