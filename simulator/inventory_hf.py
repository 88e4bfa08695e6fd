"""Op inventories of Hugging Face eager PyTorch (unfused), one function per architecture.

Each function lists what ``transformers`` launches for the embedding, one layer and the
head, in forward order, as read from the NeuSight per-operator traces (torch.fx nodes).
``host_ops`` is the trace's count of fx nodes per layer that launch no kernel.
Attention scores are ``(B*heads*S, S)`` rows; views and permutes launch nothing, but
``torch.matmul`` copies an operand that reaches it as a permuted view into the layout ``bmm``
needs (`attention_core`'s ``copied``: the traces flag those inputs non-contiguous and time the
copies inside the ``matmul`` node).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from forecast.kernels import Dtype
from simulator import oprules as r
from simulator.models import ModelSpec
from simulator.opgraph import Block, Workload
from simulator.oprules import FrameworkOp


@dataclass(frozen=True, slots=True)
class Sizes:
    """The shapes one inventory needs."""

    T: int  # tokens = batch * seq
    B: int
    S: int
    H: int
    F: int
    nh: int
    kv: int
    d: int
    V: int
    dt: Dtype
    keys: int  # keys each query attends to: S, or past + S under a KV cache
    logit_rows: int  # rows of the output head: T, or B under a KV cache
    cache: bool  # generation with a KV cache (`opgraph.Workload.kv_cache`)

    @property
    def scores(self) -> tuple[int, int]:
        """Attention-score matrix as rows x columns."""
        return (self.B * self.nh * self.S, self.keys)


def sizes(m: ModelSpec, run: Workload) -> Sizes:
    """Shapes of a model under a workload."""
    return Sizes(
        run.tokens,
        run.batch,
        run.seq,
        m.hidden_size,
        m.ffn_hidden_size,
        m.num_heads,
        m.kv_heads,
        m.dhead,
        m.vocab_size,
        run.dtype,
        run.keys,
        run.logit_rows,
        run.kv_cache,
    )


def attention_core(
    z: Sizes, *, mask_op: str, scale: bool = True, copied: str = ""
) -> list[FrameworkOp]:
    """QK^T, scale (not in T5, which folds it into its initialisation), mask, softmax,
    dropout, AV and the head-merge copy. ``copied`` names the operands (of ``q``, ``k``,
    ``v``) that reach ``torch.matmul`` as permuted views: it copies each into the
    one-matrix-per-head layout ``bmm`` needs before the product (`_with_copies`)."""
    bh = z.B * z.nh
    qk = _with_copies(r.bmm("qk", (bh, z.S, z.d, z.keys), z.dt), z, copied.replace("v", ""))
    av = _with_copies(r.bmm("av", (bh, z.S, z.keys, z.d), z.dt), z, "v" if "v" in copied else "")
    masks = {
        # causal mask by torch.where over the scores
        "where": lambda: r.memory("mask", "masked_fill", z.scores, z.dt, bw_op="masked_fill"),
        # a full-size additive bias (T5/Switch position bias)
        "add": lambda: r.elementwise("mask", "add", z.scores, z.dt),
        # a mask broadcast over heads (BERT's [B, 1, 1, S], Llama's [B, 1, S, S]): one
        # full-size read, timed like the scalar form in the BERT traces
        "add_row": lambda: r.elementwise("mask", "addu", z.scores, z.dt),
    }
    mask = masks[mask_op]()
    return [
        qk,
        *([r.elementwise("scale", "divu", z.scores, z.dt)] if scale else []),
        mask,
        r.softmax("softmax", *z.scores, z.dt),
        r.dropout("attn_dropout", *z.scores, z.dt),
        av,
        r.memory("merge_heads", "copy", (z.T, z.nh * z.d), z.dt),
    ]


def _with_copies(fop: FrameworkOp, z: Sizes, copied: str) -> FrameworkOp:
    """``fop`` (a ``bmm``) with the copies of its operands named in ``copied`` before it, in
    its forward (a trace times them inside the ``matmul`` node): q's ``T`` rows, k's and v's
    ``B x keys``, the width of all heads. Keys and values concatenated with a KV cache
    (`cache_append`) are laid out already, and so is a pass of one token a sequence (a decode
    step: its heads need no permuting); neither is copied."""
    rows = {"q": z.T, "k": z.B * z.keys, "v": z.B * z.keys}
    cat = z.cache and z.keys != z.S
    kernels = [
        r.memory(f"{fop.name}_copy_{x}", "copy", (rows[x], z.nh * z.d), z.dt).fw[0]
        for x in copied
        if z.S > 1 and not (cat and x in "kv")
    ]
    return replace(fop, fw=(*fop.fw, *kernels))


def cache_append(z: Sizes, kv_width: int) -> list[FrameworkOp]:
    """Appending a pass's keys and values to HF's ``DynamicCache``: nothing for the first
    pass (the cache keeps its K and V tensors); after it, ``torch.cat`` of the cached and the
    new ones, a copy of all ``past + S`` keys and values of every sequence."""
    if not z.cache or z.keys == z.S:
        return []
    return [r.memory("cache_cat", "copy", (z.B * z.keys, 2 * kv_width), z.dt, bw_op="copy")]


GELU_NEW = ("mulu", "powu", "mulu", "add", "mulu", "tanh", "addu", "mul")


def _residual(z: Sizes, tag: str) -> list[FrameworkOp]:
    return [
        r.dropout(f"{tag}_dropout", z.T, z.H, z.dt),
        r.elementwise(f"{tag}_add", "add", (z.T, z.H), z.dt),
    ]


def gpt2(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """GPT2LMHeadModel (Conv1D projections, gelu_new as 8 element-wise kernels)."""
    z = sizes(m, run)
    act = GELU_NEW if m.activation == "gelu_new" else (m.activation,)  # gelu or relu
    layer = [
        r.layernorm("ln_1", z.T, z.H, z.dt),
        r.linear("c_attn", z.T, (z.H, 3 * z.H), z.dt),
        *cache_append(z, z.H),
        *attention_core(z, mask_op="where", copied="qkv"),
        r.linear("attn_c_proj", z.T, (z.H, z.H), z.dt),
        *_residual(z, "attn"),
        r.layernorm("ln_2", z.T, z.H, z.dt),
        r.linear("c_fc", z.T, (z.H, z.F), z.dt),
        *(r.elementwise(f"act_{i}", op, (z.T, z.F), z.dt) for i, op in enumerate(act)),
        r.linear("mlp_c_proj", z.T, (z.F, z.H), z.dt),
        *_residual(z, "mlp"),
    ]
    embed = [
        r.embedding("wte", z.T, (z.V, z.H), z.dt),
        r.embedding("wpe", z.S, (m.max_positions, z.H), z.dt),
        r.elementwise("add_pos", "add", (z.T, z.H), z.dt),
        r.dropout("drop", z.T, z.H, z.dt),
    ]
    head = [
        r.layernorm("ln_f", z.T, z.H, z.dt),
        r.tie(r.linear("lm_head", z.logit_rows, (z.H, z.V), z.dt, bias=False), m.tied_embeddings),
    ]
    return (
        Block("embed", tuple(embed), host_ops=20),
        Block("layer", tuple(layer), m.num_layers, host_ops=80),
        Block("head", tuple(head), host_ops=2),
    )


def bert(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """BERT as traced: separate q/k/v projections, additive mask, post-norm; the heads of
    BertForSequenceClassification for inference and BertForPreTraining for training (the
    traces' last rows: a 2-way classifier, or the vocabulary decoder and next-sentence head).
    The padding mask is ``[B, 1, 1, S]`` (``add_row``)."""
    z = sizes(m, run)
    layer = [
        *(r.linear(n, z.T, (z.H, z.H), z.dt) for n in ("query", "key", "value")),
        *attention_core(z, mask_op="add_row", copied="qkv"),
        r.linear("attn_out", z.T, (z.H, z.H), z.dt),
        *_residual(z, "attn"),
        r.layernorm("attn_ln", z.T, z.H, z.dt),
        r.linear("intermediate", z.T, (z.H, z.F), z.dt),
        r.elementwise("gelu", "gelu", (z.T, z.F), z.dt),
        r.linear("output", z.T, (z.F, z.H), z.dt),
        *_residual(z, "out"),
        r.layernorm("out_ln", z.T, z.H, z.dt),
    ]
    embed = [
        r.embedding("word", z.T, (z.V, z.H), z.dt),
        r.embedding("token_type", z.T, (2, z.H), z.dt),
        r.elementwise("add_type", "add", (z.T, z.H), z.dt),
        r.embedding("position", z.S, (m.max_positions, z.H), z.dt),
        r.elementwise("add_pos", "add", (z.T, z.H), z.dt),
        r.layernorm("ln", z.T, z.H, z.dt),
        r.dropout("drop", z.T, z.H, z.dt),
    ]
    head = _bert_head(m, z, run)
    return (
        Block("embed", tuple(embed), host_ops=25),
        Block("layer", tuple(layer), m.num_layers, host_ops=24),
        Block("head", tuple(head), host_ops=2),
    )


def _bert_head(m: ModelSpec, z: Sizes, run: Workload) -> list[FrameworkOp]:
    """The pooler (a linear and tanh over each sequence's first token), then the traced
    models' heads: a 2-way classifier for inference, the MLM transform, vocabulary decoder
    and next-sentence classifier for training."""
    pooler = [
        r.linear("pooler", z.B, (z.H, z.H), z.dt),
        r.elementwise("pooler_tanh", "tanh", (z.B, z.H), z.dt),
    ]
    if run.mode == "inf":  # BertForSequenceClassification (the traced inference model)
        return [*pooler, r.linear("classifier", z.B, (z.H, 2), z.dt)]
    # BertForPreTraining (the traced training model): MLM over the vocabulary + NSP
    return [
        *pooler,
        r.linear("transform", z.T, (z.H, z.H), z.dt),
        r.elementwise("transform_gelu", "gelu", (z.T, z.H), z.dt),
        r.layernorm("transform_ln", z.T, z.H, z.dt),
        r.tie(r.linear("decoder", z.T, (z.H, z.V), z.dt), m.tied_embeddings),
        r.linear("seq_relationship", z.B, (z.H, 2), z.dt),
    ]


def opt(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """OPTForCausalLM: pre-norm, scaled q, three head-split copies, mask add + clamp, ReLU;
    a ``word_embed_proj_dim`` other than the hidden size adds ``project_in`` after the token
    table and ``project_out`` before the head (OPT-350m)."""
    z = sizes(m, run)
    layer = [
        r.layernorm("attn_ln", z.T, z.H, z.dt),
        *_opt_attention(z),
        r.linear("out_proj", z.T, (z.H, z.H), z.dt),
        *_residual(z, "attn"),
        r.layernorm("ffn_ln", z.T, z.H, z.dt),
        r.linear("fc1", z.T, (z.H, z.F), z.dt),
        r.elementwise("relu", "relu", (z.T, z.F), z.dt),
        r.linear("fc2", z.T, (z.F, z.H), z.dt),
        *_residual(z, "ffn"),
    ]
    e = m.embed_width  # word_embed_proj_dim: projected to and from the hidden size
    project_in = [r.linear("project_in", z.T, (e, z.H), z.dt, bias=False)] if e != z.H else []
    project_out = [r.linear("project_out", z.T, (z.H, e), z.dt, bias=False)] if e != z.H else []
    embed = [
        r.embedding("tokens", z.T, (z.V, e), z.dt),
        *project_in,
        *(r.memory(f"mask_{i}", "masked_fill", (z.B * z.S, z.keys), z.dt) for i in range(5)),
        r.embedding("positions", z.T, (m.max_positions, z.H), z.dt),
        r.elementwise("add_pos", "add", (z.T, z.H), z.dt),
        r.dropout("drop", z.T, z.H, z.dt),
    ]
    head = [
        r.layernorm("final_ln", z.T, z.H, z.dt),
        *project_out,
        r.tie(r.linear("lm_head", z.logit_rows, (e, z.V), z.dt, bias=False), m.tied_embeddings),
    ]
    return (
        Block("embed", tuple(embed), host_ops=40),
        Block("layer", tuple(layer), m.num_layers, host_ops=43),
        Block("head", tuple(head), host_ops=2),
    )


def _opt_attention(z: Sizes) -> list[FrameworkOp]:
    """OPTAttention up to its output projection, in launch order: q, k and v projections (q
    scaled), a head-split copy of each, QK^T, the mask added and clamped, softmax, AV and the
    head-merge copy."""
    scores = z.scores
    return [
        r.linear("q_proj", z.T, (z.H, z.H), z.dt),
        r.elementwise("q_scale", "mulu", (z.T, z.H), z.dt),
        r.linear("k_proj", z.T, (z.H, z.H), z.dt),
        r.linear("v_proj", z.T, (z.H, z.H), z.dt),
        *(r.memory(f"split_{x}", "copy", (z.T, z.H), z.dt) for x in "qkv"),
        *cache_append(z, z.H),
        r.bmm("qk", (z.B * z.nh, z.S, z.d, z.keys), z.dt),
        r.elementwise("mask_add", "add", scores, z.dt),
        r.maximum("mask_clamp", scores, z.dt),
        r.softmax("softmax", *scores, z.dt),
        r.bmm("av", (z.B * z.nh, z.S, z.keys, z.d), z.dt),
        r.memory("merge_heads", "copy", (z.T, z.H), z.dt),
    ]


def _hf_llama(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    from simulator.inventory_hf_moe import llama

    return llama(m, run)


def _hf_switch(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    from simulator.inventory_hf_moe import switch

    return switch(m, run)


HF_INVENTORIES: dict[str, Callable[[ModelSpec, Workload], tuple[Block, ...]]] = {
    "gpt2": gpt2,
    "bert": bert,
    "opt": opt,
    "llama": _hf_llama,
    "mixtral": _hf_llama,
    "switch": _hf_switch,
}
