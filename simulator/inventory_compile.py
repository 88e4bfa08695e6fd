"""Op inventories of Hugging Face models under ``torch.compile`` (TorchInductor), inference:
GPT-2, BERT, OPT and Llama (dense; eager attention, as the measured runs used).

Inductor keeps the GEMMs as library calls (cuBLAS ``mm``/``addmm``/``bmm``: the eager
kernels) and generates one Triton kernel for each run of other ops between them, fusing
element-wise producers into the reduction that reads them. So, against `inventory_hf`:

* the attention's scale and mask fuse into its softmax: one softmax kernel of the scores;
* a residual add fuses into the layer norm that reads its sum: one layer-norm kernel that
  reads both addends and writes what is read later (pre-norm: the sum and the normalised
  output, 2 reads and 2 writes; post-norm: the normalised output only, 2 reads and 1 write),
  priced as a layer norm of ``(reads + writes) / 2`` times the rows, the bytes it moves (as
  `oprules.layernorm` prices its backward);
* the token and position gathers and their add fuse into the first layer norm that reads
  them (GPT-2, OPT, Llama: the first layer's; BERT: the embedding's own, 3 reads and 1 write);
* an activation's chain of element-wise kernels (GPT-2's ``gelu_new``, eight in eager) is one
  unary element-wise kernel (Llama's SiLU(gate) x up, one binary kernel); the rotary
  embeddings of q and k (ten kernels in eager) one unary kernel; a scale before a head-split
  copy fuses into that copy;
* the permute copies that feed a ``bmm`` stay copies: the head splits of q, k and v (``bmm``
  needs one matrix per sequence and head; q and k in one kernel, v in another, GPT-2's
  three, read from its fused projection, in one; Llama's q and k written so by their rotary
  kernels), GQA's repeated keys and
  values, and the head merge before the output projection.

Checked against Inductor itself (`benchmarks/inductor_inventory.py`: torch 2.13, CPU backend,
which makes the same layout and fusion choices) on `examples/gpt2_module.py` and a BERT and a
Llama of HF's eager attention: the same ``addmm``/``mm`` and ``bmm`` calls and as many
generated kernels, the GPT-2's Inductor copying q and k in one kernel and v inside the
softmax kernel where we copy all three in one.
Newer Inductor also rewrites BERT's attention (scores, scale, mask add, softmax, AV) into one
``scaled_dot_product_attention`` call (its pattern matcher, on the same check); NeuSight's
runs used PyTorch 2.1.0, and that rewrite is not modelled.

Dropout launches nothing in inference. Training under ``torch.compile`` (AOTAutograd's fused
backward) and generation with a KV cache are not modelled: the measured compiled runs
(NeuSight's ``-fusion`` labels) are single inference passes.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator import oprules as r
from simulator.errors import ConfigError
from simulator.inventory_hf import Sizes, sizes
from simulator.models import ModelSpec
from simulator.opgraph import Block, Workload
from simulator.oprules import FrameworkOp


def fused_layernorm(name: str, z: Sizes, reads: int, writes: int) -> FrameworkOp:
    """A layer norm with element-wise producers fused in: ``reads`` full-size inputs, ``writes``
    full-size outputs, priced as a layer norm of ``(reads + writes) / 2 x T`` rows."""
    return r.layernorm(name, z.T * (reads + writes) // 2, z.H, z.dt)


def _split_heads(z: Sizes, *names: str) -> list[FrameworkOp]:
    """The copies that lay projections' outputs out for ``bmm`` (one matrix per sequence and
    head), one kernel per name: Inductor copies q and k in one kernel, v in another, and
    GPT-2's three, read from its fused projection, in one."""
    return [r.memory(f"split_{n}", "copy", (z.T, z.nh * z.d * len(n)), z.dt) for n in names]


def _attention(z: Sizes) -> list[FrameworkOp]:
    """QK^T, the softmax with its scale and mask fused in, AV and the head-merge copy."""
    bh = z.B * z.nh
    return [
        r.bmm("qk", (bh, z.S, z.d, z.keys), z.dt),
        r.softmax("softmax", *z.scores, z.dt),
        r.bmm("av", (bh, z.S, z.keys, z.d), z.dt),
        r.memory("merge_heads", "copy", (z.T, z.nh * z.d), z.dt),
    ]


def _act(z: Sizes, op: str) -> FrameworkOp:
    """The MLP's activation, one unary kernel (the operator `inventory_hf` runs for it)."""
    return r.elementwise("act", op, (z.T, z.F), z.dt)


def gpt2(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """GPT2LMHeadModel (pre-norm): each layer norm reads a residual sum's two addends and
    writes the sum and its output (the first layer's adds the token and position gathers;
    the final norm, the last layer's MLP residual)."""
    z = sizes(m, run)
    layer = [
        fused_layernorm("add_ln_1", z, reads=2, writes=2),
        r.linear("c_attn", z.T, (z.H, 3 * z.H), z.dt),
        *_split_heads(z, "qkv"),
        *_attention(z),
        r.linear("attn_c_proj", z.T, (z.H, z.H), z.dt),
        fused_layernorm("add_ln_2", z, reads=2, writes=2),
        r.linear("c_fc", z.T, (z.H, z.F), z.dt),
        _act(z, "gelu"),
        r.linear("mlp_c_proj", z.T, (z.F, z.H), z.dt),
    ]
    head = [
        fused_layernorm("add_ln_f", z, reads=2, writes=1),
        r.tie(r.linear("lm_head", z.logit_rows, (z.H, z.V), z.dt, bias=False), m.tied_embeddings),
    ]
    return (
        Block("embed", ()),  # the gathers run inside the first layer's norm
        Block("layer", tuple(layer), m.num_layers),
        Block("head", tuple(head)),
    )


def bert(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """BERT (post-norm): each layer norm reads the sublayer's output and the residual and
    writes its output; the embedding's norm reads the three gathers. The inference head of
    `inventory_hf.bert` (pooler, tanh, 2-way classifier)."""
    z = sizes(m, run)
    layer = [
        *(r.linear(n, z.T, (z.H, z.H), z.dt) for n in ("query", "key", "value")),
        *_split_heads(z, "qk", "v"),
        *_attention(z),
        r.linear("attn_out", z.T, (z.H, z.H), z.dt),
        fused_layernorm("add_attn_ln", z, reads=2, writes=1),
        r.linear("intermediate", z.T, (z.H, z.F), z.dt),
        _act(z, "gelu"),
        r.linear("output", z.T, (z.F, z.H), z.dt),
        fused_layernorm("add_out_ln", z, reads=2, writes=1),
    ]
    embed = [fused_layernorm("embed_ln", z, reads=3, writes=1)]
    head = [
        r.linear("pooler", z.B, (z.H, z.H), z.dt),
        r.elementwise("pooler_tanh", "tanh", (z.B, z.H), z.dt),
        r.linear("classifier", z.B, (z.H, 2), z.dt),
    ]
    return (
        Block("embed", tuple(embed)),
        Block("layer", tuple(layer), m.num_layers),
        Block("head", tuple(head)),
    )


def opt(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """OPTForCausalLM (pre-norm, as GPT-2): separate q, k and v projections split into heads
    as BERT's are (q's scale fused into the copy), the mask built once (one kernel of the
    scores' rows per sequence), the mask add and clamp fused into the softmax."""
    z = sizes(m, run)
    e = m.embed_width
    layer = [
        fused_layernorm("add_attn_ln", z, reads=2, writes=2),
        *(r.linear(f"{x}_proj", z.T, (z.H, z.H), z.dt) for x in "qkv"),
        *_split_heads(z, "qk", "v"),
        *_attention(z),
        r.linear("out_proj", z.T, (z.H, z.H), z.dt),
        fused_layernorm("add_ffn_ln", z, reads=2, writes=2),
        r.linear("fc1", z.T, (z.H, z.F), z.dt),
        _act(z, "relu"),
        r.linear("fc2", z.T, (z.F, z.H), z.dt),
    ]
    project_in = [r.linear("project_in", z.T, (e, z.H), z.dt, bias=False)] if e != z.H else []
    project_out = [r.linear("project_out", z.T, (z.H, e), z.dt, bias=False)] if e != z.H else []
    embed = [*project_in, r.memory("mask", "masked_fill", (z.B * z.S, z.keys), z.dt)]
    head = [
        fused_layernorm("add_final_ln", z, reads=2, writes=1),
        *project_out,
        r.tie(r.linear("lm_head", z.logit_rows, (e, z.V), z.dt, bias=False), m.tied_embeddings),
    ]
    return (
        Block("embed", tuple(embed)),
        Block("layer", tuple(layer), m.num_layers),
        Block("head", tuple(head)),
    )


def llama(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """LlamaForCausalLM in eager attention (pre-norm, as GPT-2; RMSNorm, a reduction like a
    layer norm, priced as one): the rotary embeddings of q and k one kernel (writing them laid
    out for ``bmm``), v's head split (or GQA's repeated keys and values) a copy, SiLU(gate) x
    up one kernel reading both. As Inductor compiles a lone Llama layer of eager attention
    (torch 2.13, CPU backend, no pattern rewrites): the same ``mm`` and ``bmm`` calls and
    these seven generated kernels, plus the last residual add, which in a stack of layers
    fuses into the next one's norm."""
    z = sizes(m, run)
    qd, kvd = z.nh * z.d, z.kv * z.d
    repeat_kv = [r.memory(f"repeat_{x}", "copy", (z.B * z.keys, qd), z.dt) for x in "kv"]
    layer = [
        fused_layernorm("add_input_norm", z, reads=2, writes=2),
        r.linear("q_proj", z.T, (z.H, qd), z.dt, bias=False),
        r.linear("k_proj", z.T, (z.H, kvd), z.dt, bias=False),
        r.linear("v_proj", z.T, (z.H, kvd), z.dt, bias=False),
        r.elementwise("rope_qk", "mulu", (z.T, qd + kvd), z.dt),
        *(repeat_kv if z.kv < z.nh else _split_heads(z, "v")),
        *_attention(z),
        r.linear("o_proj", z.T, (qd, z.H), z.dt, bias=False),
        fused_layernorm("add_post_norm", z, reads=2, writes=2),
        r.linear("gate_proj", z.T, (z.H, z.F), z.dt, bias=False),
        r.linear("up_proj", z.T, (z.H, z.F), z.dt, bias=False),
        r.elementwise("silu_mul", "mul", (z.T, z.F), z.dt),
        r.linear("down_proj", z.T, (z.F, z.H), z.dt, bias=False),
    ]
    head = [
        fused_layernorm("add_norm", z, reads=2, writes=1),
        r.tie(r.linear("lm_head", z.logit_rows, (z.H, z.V), z.dt, bias=False), m.tied_embeddings),
    ]
    return (
        Block("embed", ()),  # the token gather runs inside the first layer's norm
        Block("layer", tuple(layer), m.num_layers),
        Block("head", tuple(head)),
    )


def _inference_only(
    fn: Callable[[ModelSpec, Workload], tuple[Block, ...]],
) -> Callable[[ModelSpec, Workload], tuple[Block, ...]]:
    def checked(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
        if run.mode != "inf" or run.kv_cache:
            what = "training" if run.mode != "inf" else "generation with a KV cache"
            raise ConfigError(
                f"framework hf-compile models one torch.compile inference pass; {what} under "
                "torch.compile is not modelled (use --mode inf, or framework hf-eager)"
            )
        return fn(m, run)

    return checked


COMPILE_INVENTORIES: dict[str, Callable[[ModelSpec, Workload], tuple[Block, ...]]] = {
    "gpt2": _inference_only(gpt2),
    "bert": _inference_only(bert),
    "opt": _inference_only(opt),
    "llama": _inference_only(llama),
}
