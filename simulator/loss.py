"""Megatron's loss on the head of a TP shard: vocabulary-parallel cross-entropy in fp32.

On the ``(tokens, V/t)`` logits, in fp32 (16-bit logits are cast up first and the gradient
cast back): max, subtract, exp, sum and divide (four read-write passes of the logits)
forward, one scaling pass backward.
"""

from __future__ import annotations

from forecast.kernels import ITEMSIZE_BYTES, Dtype, KernelSpec, OpFamily
from simulator.inventory_hf import Sizes
from simulator.inventory_megatron import activation_dtype
from simulator.opgraph import Block
from simulator.oprules import FrameworkOp


def add_loss(head: Block, z: Sizes) -> Block:
    """The head plus Megatron's vocab-parallel cross-entropy over fp32 logits (see above)."""
    fp32 = Dtype.FP32
    rows, vocab = z.T, z.V
    passes = KernelSpec(OpFamily.SOFTMAX, (4 * rows, vocab), fp32)  # 4 read+write passes
    scale = KernelSpec(OpFamily.ELEMENTWISE, (rows, vocab), fp32, "mulu")
    loss = FrameworkOp("cross_entropy", (passes,), (scale,))
    ops = [*head.ops, loss]
    dt = activation_dtype(z.dt)  # bf16 logits under fp8 (the output layer is no TE linear)
    if ITEMSIZE_BYTES[dt] < 4:  # 16-bit -> fp32 cast and back: 6 bytes per logit each way
        cast = KernelSpec(OpFamily.MEMORY, (rows, 3 * vocab // 2), dt, "copy")
        ops.insert(len(head.ops), FrameworkOp("logits_cast", (cast,), (cast,)))
    return Block(head.name, tuple(ops), head.repeat, head.host_ops)
