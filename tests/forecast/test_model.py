"""Latency models: roofline closed form, MLP fit and round trip, batching equals one-by-one."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from forecast.bandwidth import BandwidthModel
from forecast.features import gpu_features
from forecast.gpus import GPUSpec, load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.predict import ModelError, forecast_table, load_latency_model
from forecast.roofline import RooflineModel
from forecast.tile_mlp import TileMLPModel
from forecast.tilepick import TilePicker, TileTable
from forecast.train import fit_mlp


def test_roofline_is_max_of_compute_and_memory(tiny_gpu: GPUSpec) -> None:
    big = KernelSpec(OpFamily.BMM, (1, 1024, 1024, 1024))
    vec = KernelSpec(OpFamily.ELEMENTWISE, (1024, 1024), op="add")
    s = RooflineModel().predict_s([big, vec], tiny_gpu)
    assert s[0] == pytest.approx(2 * 1024**3 / 1.28e12)
    assert s[1] == pytest.approx(3 * 4 * 1024**2 / 1e11)


def test_mlp_fits_synthetic_log_ratio() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 3)).astype(np.float32)
    y = 0.3 * x[:, 0] - 0.2 * x[:, 1] + 0.5
    net = fit_mlp(x, y, np.ones(len(x)), epochs=30)
    with torch.no_grad():
        pred = net(torch.from_numpy(x)).numpy()
    assert np.mean(np.abs(np.exp(pred - y) - 1)) < 0.05


def test_mlp_clamps_inputs_to_training_range() -> None:
    x = np.linspace(-1, 1, 200, dtype=np.float32).reshape(-1, 1)
    net = fit_mlp(x, x[:, 0].astype(np.float64), np.ones(200), epochs=5)
    with torch.no_grad():
        at_edge, beyond = net(torch.tensor([[1.0], [50.0]])).numpy()
    assert at_edge == beyond


def test_ensemble_predict_is_forward_bit_for_bit() -> None:
    """`TileEnsemble.predict` runs each member's `TileMLP.infer` (functional calls, SiLU in
    place) and must give `forward`'s bits: a block of `PREDICT_ROWS` rows, half of them past
    the training range (clamped)."""
    from forecast.mlp import PREDICT_ROWS, TileEnsemble

    torch.manual_seed(0)
    ens = TileEnsemble(3, members=3)
    for member in ens.members:
        member.set_scaling(torch.randn(50, 3))
    x = 3.0 * torch.randn(PREDICT_ROWS, 3)
    with torch.no_grad():
        want = ens(x)
    assert torch.equal(ens.predict(x), want)


def _toy_model() -> TileMLPModel:
    from forecast.features import feature_names
    from forecast.mlp import TileEnsemble

    torch.manual_seed(0)
    fams = [f for f in OpFamily if f is not OpFamily.MEMORY]
    mlps = {f: TileEnsemble(len(feature_names(f)), members=2) for f in fams}
    table = TileTable("tiny", 8.0, 10, np.zeros((1, 4), np.float32), np.array([[128, 64, 1]]))
    picker = TilePicker({"bmm": [table], "linear": [table]})
    return TileMLPModel(
        mlps=mlps, picker=picker, memory=BandwidthModel(0.5, 1e-6), meta={"members": 2}
    )


def _kernels() -> list[KernelSpec]:
    return [
        KernelSpec(OpFamily.BMM, (4, 128, 64, 256)),
        KernelSpec(OpFamily.ELEMENTWISE, (64, 1024), op="gelu"),
        KernelSpec(OpFamily.LINEAR, (1, 512, 1024, 4096)),
        KernelSpec(OpFamily.SOFTMAX, (4096, 512)),
        KernelSpec(OpFamily.MEMORY, (8, 4096), op="embedding"),
        KernelSpec(OpFamily.BMM, (1, 2048, 2048, 2048)),
        KernelSpec(OpFamily.LAYERNORM, (2048, 1024)),
    ]


def test_batched_prediction_equals_one_by_one(tiny_gpu: GPUSpec) -> None:
    model = _toy_model()
    ks = _kernels()
    batched = model.predict_s(ks, tiny_gpu)
    single = np.array([model.predict_s([k], tiny_gpu)[0] for k in ks])
    np.testing.assert_allclose(batched, single, rtol=1e-6)
    assert (batched > 0).all()


@pytest.mark.parametrize(
    ("small", "floor"),
    [
        (KernelSpec(OpFamily.SOFTMAX, (1, 1)), KernelSpec(OpFamily.SOFTMAX, (65536, 1))),
        (KernelSpec(OpFamily.SOFTMAX, (3, 1000)), KernelSpec(OpFamily.SOFTMAX, (66, 1000))),
        (
            KernelSpec(OpFamily.ELEMENTWISE, (1, 8), op="add"),
            KernelSpec(OpFamily.ELEMENTWISE, (8192, 8), op="add"),
        ),
        (KernelSpec(OpFamily.LAYERNORM, (4, 32)), KernelSpec(OpFamily.LAYERNORM, (256, 256))),
    ],
)
def test_row_kernels_under_the_floor_cost_the_floor(
    tiny_gpu: GPUSpec, small: KernelSpec, floor: KernelSpec
) -> None:
    model = _toy_model()
    got, want = model.predict_s([small, floor], tiny_gpu)
    assert got == pytest.approx(want, rel=1e-6)  # float32 MLP, batched
    big = KernelSpec(OpFamily.SOFTMAX, (4096, 512))  # above the floor: its own forecast
    assert model.predict_s([big], tiny_gpu)[0] != model.predict_s([small], tiny_gpu)[0]


def test_save_load_round_trip_is_exact(tiny_gpu: GPUSpec, tmp_path: Path) -> None:
    model = _toy_model()
    model.save(tmp_path)
    again = TileMLPModel.load(tmp_path)
    np.testing.assert_array_equal(
        model.predict_s(_kernels(), tiny_gpu), again.predict_s(_kernels(), tiny_gpu)
    )


def test_saved_weights_do_not_depend_on_the_time_of_saving(tmp_path: Path) -> None:
    """Same tables, same bytes: np.savez dated each member with the time of writing."""
    model = _toy_model()
    model.save(tmp_path / "a")
    with zipfile.ZipFile(tmp_path / "a" / "tiles_bmm.npz") as z:
        assert {i.date_time for i in z.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    model.save(tmp_path / "b")
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name


def test_tensor_core_dtype_is_a_clear_error_not_a_fallback(tiny_gpu: GPUSpec) -> None:
    with pytest.raises(ModelError, match="fp32"):
        _toy_model().predict_s([KernelSpec(OpFamily.BMM, (1, 64, 64, 64), Dtype.BF16)], tiny_gpu)


def test_forecast_table_dedupes(tiny_gpu: GPUSpec) -> None:
    ks = _kernels()
    table = forecast_table(ks + ks, tiny_gpu, RooflineModel())
    assert set(table) == set(ks)


def test_unknown_latency_model_names_the_choices() -> None:
    with pytest.raises(ValueError, match="roofline"):
        load_latency_model("oracle")


def test_missing_weights_say_how_to_train(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="kernels train"):
        TileMLPModel.load(tmp_path)


def test_training_is_deterministic_bit_for_bit() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 4)).astype(np.float32)
    y = np.sin(x[:, 0]).astype(np.float64)
    a = fit_mlp(x, y, np.ones(len(x)), epochs=3, seed=7)
    b = fit_mlp(x, y, np.ones(len(x)), epochs=3, seed=7)
    for (name, ta), tb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(ta, tb), name


def test_bmm_power_feature_counts_the_process_node() -> None:
    # a 72 W 5 nm L4 is less power-starved per lane-GHz than a 70 W 12 nm T4 for bmm;
    # linear keeps the raw watts, where the L4 reads as the more starved card
    l4, t4 = load_gpu("l4"), load_gpu("t4")
    node, raw = "log2_gpu_node_watts_per_lane_ghz", "log2_gpu_watts_per_lane_ghz"
    assert gpu_features(l4, OpFamily.BMM)[node] > gpu_features(t4, OpFamily.BMM)[node]
    assert gpu_features(l4, OpFamily.LINEAR)[raw] < gpu_features(t4, OpFamily.LINEAR)[raw]


def test_fp32_gemms_run_at_the_clock_board_power_sustains() -> None:
    """A 70 W 12 nm T4 holds 0.0172 / 0.022 of its boost clock through an SGEMM: its FP32
    GEMMs' compute time is the boost-clock time over that share. A 350 W H100 PCIe, a P4 at
    twice its board power, a sheet without board power or process node, tensor-core dtypes
    and row kernels keep the boost clock."""
    from forecast.features import build_features, sustained_clock_ratio

    t4 = load_gpu("t4")
    share = t4.tdp_w / (t4.num_sms * 64 * t4.boost_clock_hz / 1e9) / 0.022
    assert sustained_clock_ratio(t4) == pytest.approx(share) and 0.77 < share < 0.79
    assert sustained_clock_ratio(load_gpu("h100-pcie-80gb")) == 1.0
    p4 = load_gpu("p4")
    assert sustained_clock_ratio(p4) < 1.0
    assert sustained_clock_ratio(p4.model_copy(update={"tdp_w": 150.0})) == 1.0
    assert sustained_clock_ratio(t4.model_copy(update={"tdp_w": None})) == 1.0
    assert sustained_clock_ratio(t4.model_copy(update={"process_nm": None})) == 1.0
    unlimited = t4.model_copy(update={"tdp_w": 1000.0})
    for family, op in ((OpFamily.LINEAR, "linear"), (OpFamily.BMM, "bmm")):
        k = KernelSpec(family, (1, 4096, 1024, 4096), Dtype.FP32, op)
        capped = build_features(t4, [k], np.array([[128, 64, 1]]))
        free = build_features(unlimited, [k], np.array([[128, 64, 1]]))
        assert capped.compute_s[0] == pytest.approx(free.compute_s[0] / share)
        assert capped.memory_s[0] == free.memory_s[0]
    tc = load_gpu("l4").model_copy(update={"tdp_w": 10.0})
    assert sustained_clock_ratio(tc) < 0.2
    k = KernelSpec(OpFamily.LINEAR, (1, 4096, 1024, 4096), Dtype.BF16, "linear")
    free = load_gpu("l4")
    assert (
        build_features(tc, [k], np.array([[128, 64, 1]])).compute_s[0]
        == build_features(free, [k], np.array([[128, 64, 1]])).compute_s[0]
    )
    row = KernelSpec(OpFamily.ELEMENTWISE, (4096, 4096), Dtype.FP32, "add")
    assert build_features(t4, [row]).base_s[0] == build_features(unlimited, [row]).base_s[0]


def test_feature_columns_follow_the_family_names() -> None:
    """Each family's matrix has its named columns in order; GEMMs have no tile columns, the
    tile they run sets their wave-quantised base time."""
    from forecast.features import build_features, feature_names

    gpu = load_gpu("a100-pcie-80gb")
    for family, op in ((OpFamily.LINEAR, "linear"), (OpFamily.BMM, "bmm")):
        k = KernelSpec(family, (1, 4096, 1024, 4096), Dtype.FP32, op)
        names = feature_names(family)
        f = build_features(gpu, [k], np.array([[128, 64, 1]]))
        assert f.x.shape == (1, len(names))
        assert not any("tile" in n or "split" in n or "blocks" in n for n in names)
        assert f.x[0, names.index("log10_base_us")] == np.float32(np.log10(f.base_s[0] * 1e6))
        # 4096 x 4096 outputs in 128 x 64 tiles: 2048 blocks on 108 SMs, 19 on the busiest;
        # 256 x 128 tiles: 512 blocks, 5 on the busiest, each four times the work: 20 / 19
        big = build_features(gpu, [k], np.array([[256, 128, 1]]))
        assert big.compute_s[0] / f.compute_s[0] == pytest.approx(20 / 19)
    rows = feature_names(OpFamily.SOFTMAX)
    assert "log2_blocks_per_sm" in rows and rows[-1] == "gpu_is_hbm"


def test_row_features_count_the_threads_of_a_rocm_launch() -> None:
    """ROCm cuts an element-wise kernel into 256-thread blocks of 1,024 elements, CUDA into
    128 threads and 512, and gives a layer norm's row 256 threads, CUDA 128 (`forecast.tiles`).
    Element-wise and layer-norm columns count threads: the same element-wise work reads
    alike on both; a layer norm reads as twice the threads on its rows, and an SM holding
    as many threads at once (half the rows)."""
    from forecast.features import build_features, feature_names

    amd = load_gpu("mi210")
    cuda = amd.model_copy(update={"vendor": "NVIDIA"})
    n = 1024 * amd.num_sms * 3
    for family, op, dims, more_threads in [
        (OpFamily.ELEMENTWISE, "add", (n // 64, 64), 0),
        (OpFamily.LAYERNORM, "layernorm", (amd.num_sms * 40, 4096), 1),
    ]:
        k = KernelSpec(family=family, op=op, dims=dims)
        diff = build_features(amd, [k]).x[0] - build_features(cuda, [k]).x[0]
        step = dict(zip(feature_names(family), diff, strict=True))
        assert step["log2_threads_per_sm"] == more_threads, family
        assert step["log2_resident_threads"] == 0, family
        assert step["log2_threads_per_block"] == 1, family  # 256 against 128
    assert "log2_blocks_per_sm" in feature_names(OpFamily.SOFTMAX)


def test_linear_transformer_shapes_weigh_their_share_of_a_gpu() -> None:
    """A GPU's transformer shapes (``test/``) weigh `TEST_SHARE` of its training weight for
    linear, half for the other families; a GPU with one set weighs its rows alike."""
    import pandas as pd

    from forecast.train import TEST_SHARE, row_weights

    rows = pd.DataFrame({"source": ["a/test/linear.csv.gz"] * 3 + ["a/train/linear.csv"] * 7})
    is_test = rows["source"].str.contains("/test/").to_numpy()
    share = TEST_SHARE[OpFamily.LINEAR]
    assert share > 0.5 and OpFamily.BMM not in TEST_SHARE
    w = row_weights(rows, share)
    assert w[is_test].sum() == pytest.approx(share) and w.sum() == pytest.approx(1.0)
    assert np.ptp(w[is_test]) == 0 and np.ptp(w[~is_test]) == 0
    assert row_weights(rows)[is_test].sum() == pytest.approx(0.5)
    assert np.all(row_weights(rows[is_test], share) == pytest.approx(1 / 3))


@pytest.mark.parametrize("gpu_id", ["l4", "a100-pcie-80gb", "t4", "h100-sxm5-80gb"])
def test_softmax_and_layer_norm_stream_no_faster_than_an_element_wise_kernel(gpu_id: str) -> None:
    """A softmax or layer norm moving more bytes than the L2 holds takes at least what the
    shipped element-wise MLP forecasts a relu of its shape to take, scaled to its bytes; one
    the L2 holds keeps the forecast it has without that floor (the floor once doubled a
    one-row layer norm's launch-bound forecast)."""
    from dataclasses import replace as copy

    model = load_latency_model("tile-mlp")
    assert isinstance(model, TileMLPModel)
    no_floor = copy(
        model, mlps={f: m for f, m in model.mlps.items() if f is not OpFamily.ELEMENTWISE}
    )
    gpu = load_gpu(gpu_id)
    shapes = [(1, 32), (4, 1024), (64, 4096), (8192, 1280), (65536, 4096), (1, 2**22)]
    for family, extra in ((OpFamily.SOFTMAX, 0), (OpFamily.LAYERNORM, 2)):
        ks = [KernelSpec(family, s) for s in shapes]
        relu = model.predict_s(
            [KernelSpec(OpFamily.ELEMENTWISE, s, op="relu") for s in shapes], gpu
        )
        got, without = model.predict_s(ks, gpu), no_floor.predict_s(ks, gpu)
        for k, t, t0, r in zip(ks, got, without, relu, strict=True):
            b, h = k.dims
            if k.bytes() > gpu.l2_bytes:
                assert t >= r * (2 * b * h + extra * h) / (2 * b * h) * (1 - 1e-12), k
                assert t >= t0
            else:
                assert t == t0, k
