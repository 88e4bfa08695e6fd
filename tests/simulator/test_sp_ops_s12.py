"""Which ops sequence parallelism splits over the TP ranks: the ones tensor parallelism leaves
whole and that launch no GEMM (`sequence_parallel.sequence_parallel_block`), not every
``(tokens, h)`` row op by shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from forecast.kernels import OpFamily
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.stagecost import shard_kernels

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
S, H = 128, 256  # the tiny scenario's sequence and hidden size; ffn = 4h


def _tiny(*sets: str) -> SimInputs:
    return resolve(load_scenario(TINY, overrides=sets))


def _run(tp: int, sp: bool) -> RunConfig:
    return RunConfig(tp=tp, pp=1, dp=0, micro_batch_size=1, sequence_parallel=sp)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_an_ffn_activation_as_wide_as_h_is_not_split_again(dtype: str) -> None:
    """GPT (ffn = 4h) at tp 4: a shard's GeLU runs over ``(s, 4h / 4) = (s, h)``, the shape of
    a norm's input, and sequence parallelism divided it by tp a second time (``s / 4`` rows)."""
    inputs = _tiny("cluster.gpu='h100-sxm5-80gb'", f"training.dtype='{dtype}'")
    layer = shard_kernels(inputs, _run(4, True)).layer_fw
    gelu = [k for k, _ in layer if k.family is OpFamily.ELEMENTWISE and k.op == "gelu"]
    assert [k.dims for k in gelu] == [(S, H)]  # all s tokens, F / tp = h columns
    norms = [k for k, _ in layer if k.family is OpFamily.LAYERNORM]
    assert [k.dims for k in norms] == [(S // 4, H)] * 2  # the norms: s / tp rows


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallelism_splits_only_the_row_ops_tp_leaves_whole(tp: int) -> None:
    """With and without SP the same kernels but for the norms and dropout-adds of the layer and
    the head's final norm, which run on ``s / tp`` rows; the GEMMs, the attention, the loss
    and the embedding lookup (vocabulary-parallel: every token, then reduce-scattered) keep
    their shapes."""
    inputs = _tiny()
    plain, sp = shard_kernels(inputs, _run(tp, False)), shard_kernels(inputs, _run(tp, True))
    for name in ("layer_fw", "layer_bw", "head_fw", "head_bw", "embed_fw", "embed_bw"):
        a, b = getattr(plain, name), getattr(sp, name)
        assert len(a) == len(b), name
        for (ka, _), (kb, _) in zip(a, b, strict=True):
            if ka == kb:
                continue
            assert ka.family in (OpFamily.LAYERNORM, OpFamily.ELEMENTWISE, OpFamily.MEMORY)
            assert ka.dims[1] == H and kb.dims == (ka.dims[0] // tp, H), (name, ka, kb)
    lookups = [k for k, _ in sp.embed_fw if k.op == "embedding"]
    assert lookups and all(k.dims[0] == S for k in lookups)
    split = [k for k, _ in sp.layer_fw if k.dims == (S // tp, H)]
    assert len(split) == 4  # two norms, two dropout-adds
