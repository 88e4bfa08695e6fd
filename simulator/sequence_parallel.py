"""Megatron sequence parallelism on a TP shard's blocks: the rows each GPU runs alone.

The row-wise ops over ``(tokens, hidden)`` that tensor parallelism leaves whole (norms,
dropout-adds, a row-parallel linear's bias gradient) run on ``tokens / tp`` rows, and so do a
MoE layer's router and token permutes (``megatron``). `stagecost.shard_kernels` applies
`sequence_parallel_block` to each block against the same block of the unsplit model.
"""

from __future__ import annotations

from dataclasses import replace

from forecast.kernels import ROW_FAMILIES, KernelSpec, OpFamily
from simulator import oprules as r
from simulator.opgraph import Block, Workload
from simulator.oprules import FrameworkOp

# A MoE layer's router and token permutes (`inventory_megatron.decoder`). Under sequence
# parallelism a TP rank routes and permutes its own s/tp tokens: Megatron-core's MoELayer runs
# the router on the sequence-parallel hidden states, and the token dispatcher permutes their
# ``num_local_tokens x k`` rows before its all-to-all and unpermutes as many after it.
MOE_LOCAL_OPS = frozenset({"router", "permute", "unpermute"})


def _sp_kernel(k: KernelSpec, whole: KernelSpec, tokens: int, hidden: int, tp: int) -> KernelSpec:
    """``k`` on ``tokens / tp`` rows where it is a row-wise kernel over ``(tokens, hidden)``
    that tensor parallelism leaves whole (``whole``: the same kernel of the unsplit model)."""
    rows = {tokens, tokens * 3 // 2, tokens // 2}
    if (
        k == whole
        and k.family in ROW_FAMILIES
        and len(k.dims) == 2
        and k.dims[1] == hidden
        and k.dims[0] in rows
    ):
        return KernelSpec(k.family, (max(1, k.dims[0] // tp), hidden), k.dtype, k.op)
    return k


def _own_tokens(fop: FrameworkOp, tp: int) -> FrameworkOp:
    """A router or permute of `inventory_megatron.decoder` on ``1 / tp`` of its rows."""
    k = fop.fw[0]
    if fop.name == "router":
        _, rows, h, experts = k.dims
        return r.linear(fop.name, max(1, rows // tp), (h, experts), k.dtype, bias=False)
    rows, h = k.dims
    bw_op = fop.bw[0].op if fop.bw else ""
    return r.memory(fop.name, k.op, (max(1, rows // tp), h), k.dtype, bw_op=bw_op)


def _hidden_of(block: Block) -> int:
    for fop in block.ops:
        for k in fop.fw:
            if k.family is OpFamily.LAYERNORM:
                return k.dims[1]
    return -1


def sequence_parallel_block(block: Block, whole: Block, w: Workload, tp: int) -> Block:
    """A TP shard's ``block`` under sequence parallelism: its row-wise kernels over ``(tokens,
    h)`` that tensor parallelism leaves whole (equal in the unsplit model's ``whole`` block:
    norms, dropout-adds, a row-parallel linear's bias gradient) on ``tokens / tp`` rows, and a
    MoE layer's router and permutes on its own tokens (``megatron``). By shape alone, an FFN
    activation of ``F / tp = h`` columns (GPT at tp 4) passed for a norm's input and was split
    a second time; comparing with ``whole`` tells them apart."""
    if [f.name for f in block.ops] != [f.name for f in whole.ops]:
        raise ValueError(f"{block.name}: the TP shard's ops differ from the unsplit model's")
    hidden = _hidden_of(block)

    def split(ks: tuple[KernelSpec, ...], wks: tuple[KernelSpec, ...]) -> tuple[KernelSpec, ...]:
        return tuple(_sp_kernel(k, o, w.tokens, hidden, tp) for k, o in zip(ks, wks, strict=True))

    ops = [
        _own_tokens(fop, tp)
        if w.framework == "megatron" and fop.name in MOE_LOCAL_OPS
        else replace(fop, fw=split(fop.fw, one.fw), bw=split(fop.bw, one.bw))
        for fop, one in zip(block.ops, whole.ops, strict=True)
    ]
    return replace(block, ops=tuple(ops))
