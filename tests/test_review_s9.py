"""Review of the s9 commits: bugs found in the changed areas, each pinned by a test that failed
before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator import figures
from simulator.cli import main
from simulator.errors import ConfigError


def test_a_pgf_figure_without_tex_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """matplotlib lists .pgf as a format, but its backend runs xelatex to measure text: without
    it `tilesim kernels plot --out k.pgf` worked ~10 s and then died in a RuntimeError
    traceback (exit 1). It is one line naming the flag, exit 2, before any work."""
    monkeypatch.setattr(figures.shutil, "which", lambda name: None)
    out = tmp_path / "k.pgf"
    with pytest.raises(ConfigError, match=r"^--out .*k\.pgf: \.pgf needs xelatex, which is not"):
        figures.figure_path(out, "--out")
    assert main(["kernels", "plot", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and ".png" in err
    assert not out.exists()
    # with a TeX system the format stays on offer
    monkeypatch.setattr(figures.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert figures.figure_path(out, "--out") == out


@pytest.mark.parametrize("ep", [2, 8])
def test_hf_eager_expert_parallel_shard_runs_only_its_experts(ep: int) -> None:
    """2109b44 made `shard_model` keep num_experts and set local_experts = E/ep, and
    `expert_rows` give each local expert tokens x top-k / (E/ep) rows; the Megatron inventory
    repeats its FFN local_experts times, the HF one still num_experts times: a Mixtral layer's
    forward FLOPs per GPU grew with ep (hf-eager: 4.08e11 at ep 1, 7.69e11 at ep 2, 2.94e12 at
    ep 8; simulate of mixtral-8x7b on 16 A100s, pp 4: 1.46 s at ep 1, 2.02 s at ep 2, 3.30 s at
    ep 4). Balanced routing moves the same rows over fewer experts: the FLOPs stay put."""
    from forecast.kernels import Dtype
    from simulator.models import load_model
    from simulator.opgraph import Workload, inventory
    from simulator.parallel import RunConfig
    from simulator.stagecost import shard_model

    m = load_model("mixtral-8x7b")
    w = Workload(batch=1, seq=512, framework="hf-eager", dtype=Dtype.BF16)

    def layer_flops(ep: int) -> float:
        shard = shard_model(m, RunConfig(tp=1, pp=1, dp=8, ep=ep, micro_batch_size=1))
        layer = {b.name: b for b in inventory(shard, w)}["layer"]
        return sum(k.flops() for op in layer.ops for k in op.fw)

    assert layer_flops(ep) == pytest.approx(layer_flops(1), rel=1e-9)
