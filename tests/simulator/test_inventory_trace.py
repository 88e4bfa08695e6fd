"""The hf-eager GPT-2 inventory against a measured one-layer per-op trace (V100, training)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from simulator.models import load_model
from simulator.opgraph import Phase, Workload, build_ops

NEUSIGHT = Path(__file__).resolve().parents[3] / "shared" / "data" / "neusight"
TRACE = NEUSIGHT / "labels" / "Tesla_V100-PCIE-32GB" / "gpt2_large-train-1024-1.csv.gz"


def _trace_layer_ops() -> Counter[str]:
    pd = pytest.importorskip("pandas")
    if not TRACE.is_file():
        pytest.skip("../shared data not present")
    df = pd.read_csv(TRACE)
    layer = df["meta"].astype(str).str.contains("'transformer.h.0'") & (df["fw_latency"] > 0.025)
    return Counter(
        str(t).split(" of ")[0].replace("<built-in method ", "") for t in df.loc[layer, "target"]
    )


def test_gpt2_layer_kernel_inventory_matches_trace() -> None:
    traced = _trace_layer_ops()
    graph = build_ops(load_model("gpt2_large", data_dir=NEUSIGHT), Workload(batch=1, seq=1024))
    fw = Counter(
        op.kernel.family.value
        for op in graph.ops
        if op.phase is Phase.FORWARD and op.name.startswith("layer.")
    )
    # trace: 4 addmm, 2 matmul, softmax, 2 layer norms; ours: same families.
    assert traced["addmm"] == fw["linear"] == 4
    assert traced["matmul"] == fw["bmm"] == 2
    assert fw["softmax"] == 1 and fw["layernorm"] == 2
    # Every trace node slower than a scalar op (25 us) of the layer has one forward kernel of
    # ours, but the matmul nodes, which also copy their permuted operands (3 copies, below).
    assert sum(traced.values()) == sum(fw.values()) - 3


def test_gpt2_matmul_copies_are_the_traces_non_contiguous_inputs() -> None:
    """``torch.matmul`` copies each operand that is a permuted view (the trace's
    ``input_contiguous`` False) into ``bmm``'s layout, inside the traced node: q and k for
    QK^T, v for AV, each as wide as all heads; ours are those copies, in the same ops."""
    pd = pytest.importorskip("pandas")
    if not TRACE.is_file():
        pytest.skip("../shared data not present")
    df = pd.read_csv(TRACE)
    layer = df["meta"].astype(str).str.contains("'transformer.h.0'")
    matmul = df.loc[layer & df["target"].astype(str).str.contains("matmul")]
    flags = [f.strip() for c in matmul["input_contiguous"] for f in str(c).strip("[]").split(",")]
    graph = build_ops(load_model("gpt2_large", data_dir=NEUSIGHT), Workload(batch=1, seq=1024))
    copies = [
        op.kernel
        for op in graph.ops
        if op.phase is Phase.FORWARD
        and op.name in ("layer.qk", "layer.av")
        and op.kernel.op == "copy"
    ]
    assert flags.count("False") == len(copies) == 3
    assert {k.dims for k in copies} == {(1024, 1280)}
