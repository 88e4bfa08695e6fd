"""KernelSpec: shapes, hand-computed FLOPs and bytes, validation."""

from __future__ import annotations

import numpy as np
import pytest

from forecast.kernels import (
    FAMILY_OPS,
    ROW_FAMILIES,
    Dtype,
    KernelSpec,
    OpFamily,
    batch_bytes,
    resolve_op,
)


def test_bmm_flops_and_bytes_by_hand() -> None:
    k = KernelSpec(OpFamily.BMM, (2, 3, 5, 7))
    assert k.flops() == 2 * 2 * 3 * 5 * 7
    assert k.bytes() == 4 * 2 * (3 * 5 + 5 * 7 + 3 * 7)


def test_linear_counts_bias_and_weights_once() -> None:
    k = KernelSpec(OpFamily.LINEAR, (1, 8, 16, 32))
    assert k.flops() == 2 * 8 * 16 * 32 + 8 * 32
    assert k.bytes() == 4 * (8 * 16 + 16 * 32 + 32 + 8 * 32)


def test_binary_elementwise_reads_two_tensors_scalar_form_one() -> None:
    add = KernelSpec(OpFamily.ELEMENTWISE, (4, 8), op="add")
    addu = KernelSpec(OpFamily.ELEMENTWISE, (4, 8), op="addu")
    assert add.bytes() == 4 * 32 * 3
    assert addu.bytes() == 4 * 32 * 2


def test_dtype_scales_bytes_not_flops() -> None:
    a = KernelSpec(OpFamily.BMM, (1, 64, 64, 64), Dtype.FP32)
    b = KernelSpec(OpFamily.BMM, (1, 64, 64, 64), Dtype.BF16)
    assert a.flops() == b.flops()
    assert a.bytes() == 2 * b.bytes()


@pytest.mark.parametrize("dims", [(0, 1), (-1, 4), (1, 2, 3)])
def test_bad_dims_are_rejected(dims: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="dims"):
        KernelSpec(OpFamily.SOFTMAX, dims)


def test_op_must_belong_to_family() -> None:
    with pytest.raises(ValueError, match="not in family"):
        KernelSpec(OpFamily.ELEMENTWISE, (1, 1), op="softmax")


def test_resolve_op_names_the_accepted_ops() -> None:
    assert resolve_op("gelu") == (OpFamily.ELEMENTWISE, "gelu")
    assert resolve_op("ln") == (OpFamily.LAYERNORM, "layernorm")
    assert resolve_op("memory") == (OpFamily.MEMORY, "copy")  # a family: its first op
    with pytest.raises(ValueError, match="accepted"):
        resolve_op("conv9d")


def test_kernelspec_is_a_hashable_memo_key() -> None:
    a = KernelSpec(OpFamily.BMM, (1, 2, 3, 4))
    b = KernelSpec(OpFamily.BMM, (1, 2, 3, 4), op="bmm")
    assert a == b
    assert len({a, b}) == 1


def test_bool_masks_are_one_byte_whatever_the_dtype() -> None:
    n = 1000 * 64
    drop32 = KernelSpec(OpFamily.MEMORY, (1000, 64), Dtype.FP32, "dropout")
    drop16 = KernelSpec(OpFamily.MEMORY, (1000, 64), Dtype.BF16, "dropout")
    assert drop32.bytes() == 9 * n  # read x, write y (4 B each) and the mask (1 B)
    assert drop16.bytes() == 5 * n
    assert KernelSpec(OpFamily.MEMORY, (1000, 64), Dtype.FP32, "where").bytes() == 13 * n
    assert KernelSpec(OpFamily.MEMORY, (1000, 64), Dtype.FP32, "compare").bytes() == 5 * n
    # a broadcast mask is not counted
    assert KernelSpec(OpFamily.MEMORY, (1000, 64), Dtype.FP32, "masked_fill").bytes() == 8 * n


def test_slow_memory_ops_stream_slower_by_their_factor() -> None:
    from forecast.bandwidth import SLOW_MEMORY_OPS, BandwidthModel
    from forecast.gpus import load_gpu

    mem, gpu = BandwidthModel(efficiency=0.75, launch_s=10e-6), load_gpu("v100-pcie-32gb")
    fast = KernelSpec(OpFamily.MEMORY, (4096, 4096), Dtype.FP32, "masked_fill_full")
    slow = KernelSpec(OpFamily.MEMORY, (4096, 4096), Dtype.FP32, "dropout_backward")
    assert fast.bytes() == slow.bytes()
    t_fast, t_slow = mem.predict_s([fast, slow], gpu) - mem.launch_s
    assert t_slow / t_fast == pytest.approx(SLOW_MEMORY_OPS["dropout_backward"])


@pytest.mark.parametrize("family", list(OpFamily))
@pytest.mark.parametrize("dtype", [Dtype.FP32, Dtype.BF16, Dtype.FP8])
def test_batch_bytes_is_bytes_bit_for_bit(family: OpFamily, dtype: Dtype) -> None:
    """In arrays, for every operator of the family at once, up to sizes whose bytes pass
    float64's integers (2^53): there the Python-int sum rounds once, float64 steps would
    round at each step."""
    rng = np.random.default_rng(0)
    ops = list(FAMILY_OPS[family])
    n_dims = 2 if family in ROW_FAMILIES else 4
    dims = np.concatenate(
        [
            rng.integers(1, 2**14, size=(300, n_dims)),
            rng.integers(2**20, 2**31, size=(300, n_dims)),
            np.full((1, n_dims), 2**31 - 1),
        ]
    )
    kernel_ops = [ops[i % len(ops)] for i in range(len(dims))]
    kernels = [
        KernelSpec(family, tuple(int(x) for x in d), dtype, op)
        for d, op in zip(dims, kernel_ops, strict=True)
    ]
    got = batch_bytes(kernels[0], dims, kernel_ops)
    assert got.tolist() == [k.bytes() for k in kernels]
    assert (got >= 2.0**53).any()
