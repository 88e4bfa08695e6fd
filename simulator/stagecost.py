"""Kernels of one TP shard and their times per block: the compute side of a pipeline stage.

A shard is the model as one GPU of a TP x CP x EP group sees it: heads, KV heads, FFN width
and vocabulary divided by ``tp``, the sequence by ``cp``, experts by ``ep``; the op inventory
(`opgraph.inventory`) then lists its kernels for one micro-batch. Rules applied on top:

* sequence parallelism: the row-wise ops over ``(tokens, hidden)`` (norms, dropout-add) run on
  ``tokens / tp`` rows;
* context parallelism: the attention core runs ``cp`` ring steps of ``(S/cp) x (S/cp)`` blocks;
* recomputation: ``full`` re-runs each layer's forward before its backward, ``selective``
  re-runs the attention core only (Korthikanti et al. 2022).

`kernels_for` lists every kernel a layout needs so that the caller forecasts them once
(`forecast_table`) and reuses the table across layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

from forecast.kernels import ROW_FAMILIES, Dtype, KernelSpec, OpFamily
from forecast.predict import LatencyTable
from simulator.models import ModelSpec
from simulator.opgraph import Block, Workload, inventory
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs

ATTENTION_OPS = frozenset(
    {"flash_attention", "qk", "scale", "mask", "mask_add", "mask_clamp", "softmax"}
    | {"attn_dropout", "av"}
)
# Fused Adam moves ~32 bytes per parameter (fp32 p, g, m, v read; p, m, v written; 16-bit
# copy of p): four times a 4-byte copy (8 bytes per element). Priced through this kernel.
ADAM_REF_ELEMENTS = 16 * 65536
ADAM_REF = KernelSpec(OpFamily.MEMORY, (16, 65536), Dtype.FP32, "copy")
ADAM_COPIES = 4.0

Counted = tuple[tuple[KernelSpec, int], ...]


@dataclass(frozen=True, slots=True)
class ShardKernels:
    """Kernels (with launch counts) of one micro-batch on one shard, per block and phase."""

    embed_fw: Counted
    embed_bw: Counted
    layer_fw: Counted
    layer_bw: Counted
    attention_fw: Counted
    head_fw: Counted
    head_bw: Counted

    def all(self) -> set[KernelSpec]:
        """Every distinct kernel, plus the optimizer's reference kernel."""
        groups = (self.embed_fw, self.embed_bw, self.layer_fw, self.layer_bw, self.head_fw)
        return {k for g in (*groups, self.head_bw) for k, _ in g} | {ADAM_REF}


@dataclass(frozen=True, slots=True)
class BlockTimes:
    """Seconds per micro-batch on one shard; ``layer_*`` for one layer."""

    embed_fw_s: float
    embed_bw_s: float
    layer_fw_s: float
    layer_bw_s: float
    attention_fw_s: float
    head_fw_s: float
    head_bw_s: float
    adam_s_per_param: float


def shard_model(model: ModelSpec, run: RunConfig) -> ModelSpec:
    """The model one TP/EP shard holds."""
    tp = run.tp
    return model.model_copy(
        update={
            "num_heads": model.num_heads // tp,
            "num_kv_heads": model.kv_heads // tp,
            "head_dim": model.dhead,
            "ffn_hidden_size": -(-model.ffn_hidden_size // tp),
            "vocab_size": -(-model.vocab_size // tp),
            "num_experts": model.num_experts // run.ep,
        }
    )


def _sp_kernel(k: KernelSpec, tokens: int, hidden: int, tp: int) -> KernelSpec:
    rows = {tokens, tokens * 3 // 2, tokens // 2}
    if k.family in ROW_FAMILIES and len(k.dims) == 2 and k.dims[1] == hidden and k.dims[0] in rows:
        return KernelSpec(k.family, (max(1, k.dims[0] // tp), hidden), k.dtype, k.op)
    return k


def _expand(
    block: Block, dtype: Dtype, *, backward: bool, only: frozenset[str]
) -> list[KernelSpec]:
    out: list[KernelSpec] = []
    for fop in block.ops:
        if only and fop.name not in only:
            continue
        out += list(fop.bw) if backward else list(fop.fw)
        if backward:
            out += [KernelSpec(OpFamily.ELEMENTWISE, s, dtype, "add") for s in fop.params]
    return out


def _block_kernels(
    block: Block, w: Workload, run: RunConfig, *, backward: bool, only: frozenset[str] = frozenset()
) -> Counted:
    ks = _expand(block, w.dtype, backward=backward, only=only)
    if run.sequence_parallel and run.tp > 1:
        hidden = _hidden_of(block)
        ks = [_sp_kernel(k, w.tokens, hidden, run.tp) for k in ks]
    return tuple((k, 1) for k in ks)


def _hidden_of(block: Block) -> int:
    for fop in block.ops:
        for k in fop.fw:
            if k.family is OpFamily.LAYERNORM:
                return k.dims[1]
    return -1


def shard_kernels(inputs: SimInputs, run: RunConfig) -> ShardKernels:
    """One micro-batch's kernels on one shard, per block and phase."""
    w = Workload(
        batch=run.micro_batch_size,
        seq=inputs.seq_len // run.cp,
        framework=inputs.framework,
        dtype=inputs.dtype,
    )
    blocks = {b.name: b for b in inventory(shard_model(inputs.model, run), w)}
    embed, layer, head = blocks["embed"], blocks["layer"], blocks["head"]
    return ShardKernels(
        embed_fw=_block_kernels(embed, w, run, backward=False),
        embed_bw=_block_kernels(embed, w, run, backward=True),
        layer_fw=_block_kernels(layer, w, run, backward=False),
        layer_bw=_block_kernels(layer, w, run, backward=True),
        attention_fw=_block_kernels(layer, w, run, backward=False, only=ATTENTION_OPS),
        head_fw=_block_kernels(head, w, run, backward=False),
        head_bw=_block_kernels(head, w, run, backward=True),
    )


def kernels_for(inputs: SimInputs, runs: list[RunConfig]) -> set[KernelSpec]:
    """Every kernel the layouts need: forecast these once, then simulate them all."""
    return {k for run in runs for k in shard_kernels(inputs, run).all()}


def _sum_s(kernels: Counted, table: LatencyTable) -> float:
    return sum(table[k] * n for k, n in kernels)


def _attention_s(kernels: Counted, table: LatencyTable, run: RunConfig) -> float:
    return _sum_s(kernels, table) * run.cp


def block_times(sk: ShardKernels, table: LatencyTable, run: RunConfig) -> BlockTimes:
    """Seconds per block and phase for one micro-batch (recompute not yet added)."""
    attn_fw = _attention_s(sk.attention_fw, table, run)
    # Attention backward is ~2.5x its forward (5 GEMMs vs 2); scale the ring steps the same.
    layer_fw = _sum_s(sk.layer_fw, table) + attn_fw * (1 - 1 / run.cp)
    layer_bw = _sum_s(sk.layer_bw, table) + 2.5 * attn_fw * (1 - 1 / run.cp)
    return BlockTimes(
        embed_fw_s=_sum_s(sk.embed_fw, table),
        embed_bw_s=_sum_s(sk.embed_bw, table),
        layer_fw_s=layer_fw,
        layer_bw_s=layer_bw,
        attention_fw_s=attn_fw,
        head_fw_s=_sum_s(sk.head_fw, table),
        head_bw_s=_sum_s(sk.head_bw, table),
        adam_s_per_param=ADAM_COPIES * table[ADAM_REF] / ADAM_REF_ELEMENTS,
    )


def chunk_params(model: ModelSpec, run: RunConfig, layers: int, *, first: bool, last: bool) -> int:
    """Parameters one GPU holds for a model chunk: its layers, plus embedding or head."""
    dense = model.layer_params(moe=False)
    experts = model.layer_params(moe=True) - dense
    moe_layers = model.moe_layers(layers)
    total = layers * dense / run.tp + moe_layers * experts / (run.tp * run.ep)
    table = model.vocab_size * model.hidden_size / run.tp
    if first:
        total += table + (
            model.max_positions * model.hidden_size if model.position == "learned" else 0
        )
    if last and (run.pp > 1 or not model.tied_embeddings):
        total += table
    return int(total)
