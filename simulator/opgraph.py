"""Model + workload -> the kernels one inference pass or training step launches, per phase.

`build_ops` looks up the architecture's inventory (one function per architecture and
framework, in `inventory_hf` and `inventory_megatron`), which lists `FrameworkOp` blocks
(embedding, one layer, head) with a repeat count; `ops_from_blocks` expands blocks from any
source (an inventory, or `module_trace` of a traced ``nn.Module``). Expansion rules, stated
once here:

* forward: every block's forward kernels, ``repeat`` times; train-only ops (dropout) only in
  ``train`` mode;
* backward (``train``): every block's backward kernels, plus gradient accumulation, one
  element-wise ``add`` per parameter tensor (AccumulateGrad);
* optimizer (``train``): the framework's Adam kernels over all parameters (reported apart).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from forecast.flash_attention import has_flash_attention
from forecast.gpus import GPUSpec
from forecast.kernels import Dtype, KernelSpec, OpFamily
from simulator.errors import ConfigError
from simulator.models import ModelSpec
from simulator.oprules import FrameworkOp


class Phase(StrEnum):
    """Where a kernel runs in a step."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


Framework = Literal["hf-eager", "hf-compile", "megatron"]


def te_fp8(dtype: Dtype, framework: Framework) -> bool:
    """fp8 training as Megatron-LM runs it, with TransformerEngine: fp8 GEMMs, all else bf16."""
    return dtype is Dtype.FP8 and framework == "megatron"


MAX_TOKENS = 2**40  # tokens per pass: keeps every tensor's element count inside int64


class Workload(BaseModel):
    """How one model is run on one GPU: batch, sequence, mode, implementation, dtype."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # strict: a JSON ``true`` or ``"8"`` is not a batch size
    batch: int = Field(gt=0, strict=True)
    seq: int = Field(gt=0, strict=True)
    mode: Literal["inf", "train"] = "train"
    framework: Framework = "hf-eager"
    dtype: Dtype = Dtype.FP32
    # ``megatron`` only (HF eager is always unfused): FlashAttention, or Megatron's
    # ``CoreAttention`` before it (`inventory_megatron.unfused_attention`). Left out: flash
    # for 16- and 8-bit dtypes, unfused for fp32/tf32 (FlashAttention has no fp32 kernels),
    # as a scenario's ``attention = "auto"``; `on_gpu` drops flash where the GPU has none.
    attention: Literal["flash", "unfused"] = "flash"
    # Generation with a KV cache (``inf`` only; `simulator.serve`): the pass appends its
    # ``seq`` tokens to each sequence's cache after the ``past`` tokens already there, attends
    # over ``past + seq`` keys, and computes the logits of each sequence's last token only.
    kv_cache: bool = False
    past: int = Field(default=0, ge=0, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _default_attention(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("attention") is None:
            # a plain string here (a bad dtype is the dtype field's error, not this one's)
            dtype = str(data.get("dtype", Dtype.FP32))
            return {**data, "attention": default_attention(dtype)}
        return data

    @model_validator(mode="after")
    def _bounded(self) -> Workload:
        if self.batch * self.keys > MAX_TOKENS:
            raise ValueError(
                f"batch x (past + seq) = {self.batch * self.keys:.3g} tokens per pass; at most "
                f"{MAX_TOKENS:.3g} (2^40) are modelled"
            )
        if self.past and not self.kv_cache:
            raise ValueError("past tokens need kv_cache = true (they live in a KV cache)")
        if self.kv_cache and self.mode != "inf":
            raise ValueError("kv_cache is for inference (mode inf); a training step has none")
        return self

    @property
    def keys(self) -> int:
        """Keys each query of the pass may attend to: the cached ``past`` plus its own."""
        return self.past + self.seq

    @property
    def kv_dtype(self) -> Dtype:
        """Element type of the KV cache: the one attention reads it in. fp8 under Megatron's
        flash attention is bf16 (fp8 GEMMs only, attention in bf16: TransformerEngine's
        recipe, `inventory_megatron.flash_attention`; vLLM's fp8 weights keep a bf16 cache
        too unless told ``--kv-cache-dtype fp8``); elsewhere the workload's dtype."""
        flash = self.framework == "megatron" and self.attention == "flash"
        return Dtype.BF16 if flash and self.dtype is Dtype.FP8 else self.dtype

    @property
    def logit_rows(self) -> int:
        """Rows of the output head: every token, or each sequence's last under a KV cache."""
        return self.batch if self.kv_cache else self.tokens

    @property
    def tokens(self) -> int:
        """Tokens per forward pass."""
        return self.batch * self.seq


def default_attention(dtype: str) -> Literal["flash", "unfused"]:
    """Megatron's attention when none is named: FlashAttention for 16- and 8-bit dtypes,
    unfused for fp32/tf32 (FlashAttention has no fp32 kernels)."""
    return "unfused" if dtype in (Dtype.FP32, Dtype.TF32) else "flash"


def on_gpu(run: Workload, gpu: GPUSpec) -> Workload:
    """``run`` as it runs on ``gpu``: Megatron-LM falls back from FlashAttention to its
    unfused ``CoreAttention`` (fused scale-mask-softmax) where FlashAttention-2 has no
    kernels (`has_flash_attention`)."""
    if run.framework == "megatron" and run.attention == "flash" and not has_flash_attention(gpu):
        return run.model_copy(update={"attention": "unfused"})
    return run


@dataclass(frozen=True, slots=True)
class Block:
    """A run of framework ops repeated ``repeat`` times (a layer, the embedding, the head).

    ``host_ops`` counts the framework ops of one repeat that launch no kernel (views, size,
    getitem...): the host pays for them, the GPU does not.
    """

    name: str
    ops: tuple[FrameworkOp, ...]
    repeat: int = 1
    host_ops: int = 0


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel of a phase, launched ``count`` times."""

    name: str
    kernel: KernelSpec
    count: int
    phase: Phase


@dataclass(frozen=True, slots=True)
class OpGraph:
    """All kernels of a run, and the host-only framework ops per phase."""

    ops: tuple[Op, ...]
    host_ops: dict[Phase, int]

    def kernels(self) -> set[KernelSpec]:
        """Distinct kernels (the forecast table's keys)."""
        return {op.kernel for op in self.ops}

    def launches(self, phase: Phase) -> int:
        """Kernel launches of one phase."""
        return sum(op.count for op in self.ops if op.phase is phase)


InventoryFn = Callable[[ModelSpec, Workload], tuple[Block, ...]]


def _inventories() -> dict[tuple[str, str], InventoryFn]:
    from simulator.inventory_compile import COMPILE_INVENTORIES
    from simulator.inventory_hf import HF_INVENTORIES
    from simulator.inventory_megatron import MEGATRON_INVENTORIES

    return {
        **{("hf-eager", a): f for a, f in HF_INVENTORIES.items()},
        **{("hf-compile", a): f for a, f in COMPILE_INVENTORIES.items()},
        **{("megatron", a): f for a, f in MEGATRON_INVENTORIES.items()},
    }


def inventory(model: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """The blocks of a model under a framework; an unsupported pair names the supported ones."""
    model.check_sequence(run.keys)
    table = _inventories()
    if run.kv_cache and model.architecture not in KV_CACHE_ARCHITECTURES:
        have = ", ".join(sorted(KV_CACHE_ARCHITECTURES))
        raise ConfigError(
            f"model: {model.id} is a {model.architecture} model; generation with a KV cache "
            f"is modelled for decoder-only architectures ({have})"
        )
    key = (run.framework, model.architecture)
    if key not in table:
        have = ", ".join(sorted(f"{f}/{a}" for f, a in table))
        raise ConfigError(f"no {run.framework} inventory for {model.architecture}; have: {have}")
    if model.num_experts > 1 and key in _DENSE_ONLY:
        raise ConfigError(
            f"model: {model.id} has num_experts = {model.num_experts}, but the {run.framework} "
            f"{model.architecture} inventory has no expert layers (its forecast would leave "
            f"them out); use {_WITH_EXPERTS[run.framework]}, or num_experts = 1"
        )
    return table[key](model, run)


KV_CACHE_ARCHITECTURES = frozenset({"gpt2", "opt", "llama", "mixtral"})

# inventories of dense models: experts would be counted in memory but not run
_DENSE_ONLY = {("hf-eager", a) for a in ("gpt2", "bert", "opt")}
_DENSE_ONLY |= {("hf-compile", a) for a in ("gpt2", "bert", "opt", "llama")}
_WITH_EXPERTS = {
    "hf-eager": "framework megatron, architecture mixtral",
    "hf-compile": "framework hf-eager or megatron with architecture mixtral",
}


def _param_shapes(blocks: tuple[Block, ...]) -> list[tuple[tuple[int, int], int]]:
    """Shapes of the parameter tensors the blocks own, with their block's repeat (tied
    ones, `FrameworkOp.tied`, belong to another op)."""
    out = []
    for b in blocks:
        for fop in b.ops:
            tied = list(fop.tied)
            for shape in fop.params:
                if shape in tied:
                    tied.remove(shape)
                else:
                    out.append((shape, b.repeat))
    return out


def optimizer_kernels(run: Workload, blocks: tuple[Block, ...]) -> list[Op]:
    """Adam/AdamW: hf-eager = torch foreach AdamW (8 passes of multi-tensor element-wise
    kernels over all parameters); megatron = fused Adam (one pass reading p, g, m, v and
    writing p, m, v: modelled as two ``add`` and one ``copy`` over all parameters). The
    state it steps is fp32 whatever the workload's dtype (fp32 moments, and fp32 master
    weights in 16-bit training, as `memory.step_memory` counts them), so are its kernels.
    Tied weights (`FrameworkOp.tied`) are stepped once, with the op that owns them; no
    trainable parameter (a traced module without any): no step."""
    n = sum(r * rows * cols for (rows, cols), r in _param_shapes(blocks))
    if n == 0:
        return []
    dims = (max(1, -(-n // 65536)), 65536)
    ew, mem = OpFamily.ELEMENTWISE, OpFamily.MEMORY
    if run.framework == "megatron":
        kinds = [(ew, "add"), (ew, "add"), (mem, "copy")]
    else:
        kinds = [(ew, "mulu"), (ew, "add"), (ew, "mul"), (ew, "add"), (ew, "powu")]
        kinds += [(ew, "addu"), (ew, "div"), (ew, "add")]
    return [
        Op(f"adam.{op}", KernelSpec(fam, dims, Dtype.FP32, op), 1, Phase.OPTIMIZER)
        for fam, op in kinds
    ]


def _expand(blocks: tuple[Block, ...], run: Workload) -> list[Op]:
    ops: list[Op] = []
    train = run.mode == "train"
    # gradients accumulate in bf16 under TransformerEngine's fp8 (its weight-gradient GEMMs
    # write bf16), else in the workload's dtype
    grad_dtype = Dtype.BF16 if te_fp8(run.dtype, run.framework) else run.dtype
    for b in blocks:
        for fop in b.ops:
            if fop.train_only and not train:
                continue
            name = f"{b.name}.{fop.name}"
            ops += [Op(name, k, b.repeat, Phase.FORWARD) for k in fop.fw]
            if not train:
                continue
            ops += [Op(name, k, b.repeat, Phase.BACKWARD) for k in fop.bw]
            ops += [
                Op(
                    f"{name}.acc",
                    KernelSpec(OpFamily.ELEMENTWISE, s, grad_dtype, "add"),
                    b.repeat,
                    Phase.BACKWARD,
                )
                for s in fop.params
            ]
    return ops


def ops_from_blocks(blocks: tuple[Block, ...], run: Workload) -> OpGraph:
    """Expand blocks into the kernels of one inference pass (``inf``) or training step
    (``train``): forward, backward with gradient accumulation, optimizer (module docstring)."""
    ops = _expand(blocks, run)
    if run.mode == "train":
        ops += optimizer_kernels(run, blocks)
    fw_host = sum(b.repeat * b.host_ops for b in blocks)
    return OpGraph(tuple(ops), {Phase.FORWARD: fw_host, Phase.BACKWARD: 0, Phase.OPTIMIZER: 0})


def build_ops(model: ModelSpec, run: Workload) -> OpGraph:
    """Every kernel of one inference pass (``inf``) or training step (``train``)."""
    return ops_from_blocks(inventory(model, run), run)
