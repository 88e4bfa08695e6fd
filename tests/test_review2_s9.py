"""Second review of the s9 commits: bugs found in the changed areas, each pinned by a test that
failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from forecast.kernels import Dtype, OpFamily
from simulator.models import load_model
from simulator.moe_routing import expert_rows
from simulator.opgraph import Workload, inventory
from simulator.parallel import RunConfig
from simulator.scenario import load_scenario
from simulator.space import enumerate_space, find_scenario, point_keys
from simulator.stagecost import shard_model

ROOT = Path(__file__).resolve().parents[1]


def test_dp_zero_and_its_value_are_one_layout() -> None:
    """b8582f8 prunes only true repeats, but ``dp = [0, 2]`` on 8 GPUs at tp 2 pp 2 kept both
    (dp 0 resolves to 2): 16 points under 8 keys, each screened and simulated twice, rows
    overwriting each other, scenario.resolved.json counting 16 layouts for 8 rows and the
    report '0 pruned'. dp 0 is read as the GPUs left over before layouts are compared."""
    tiny = find_scenario("tiny-gpt-8gpu")
    grid = ["sweep.world_size=[8]", "sweep.tp=[2]", "sweep.pp=[2]"]
    both = enumerate_space(load_scenario(tiny, overrides=[*grid, "sweep.dp=[0,2]"]))
    one = enumerate_space(load_scenario(tiny, overrides=[*grid, "sweep.dp=[2]"]))
    keys = point_keys(both.points, both.contexts)
    assert len(keys) == len(set(keys))
    assert keys == point_keys(one.points, one.contexts)
    assert {r: n for r, n, _ in both.pruned_by} == {"duplicate": len(one.points)}
    assert both.pruned == len(one.points) and one.pruned == 0


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_expert_capacity_caps_each_sequence_the_all_to_all_brings(ep: int) -> None:
    """An expert capacity caps an expert's rows per sequence. After the all-to-all a shard's
    expert holds rows from the sequences of ``ep`` GPUs, each capped alone; `expert_rows` capped
    their sum, so a 64-token cap let a Mixtral layer at ep 8 run 64 rows through its one expert
    instead of 8 x 64 (megatron forward FLOPs per GPU fell with ep, compute 0.044 -> 0.016 s
    for 4 layers). Balanced routing moves the same capped rows: FLOPs per GPU stay put."""
    m = load_model("mixtral-8x7b").model_copy(update={"expert_capacity": 64})
    tokens = 1024  # 1024 x top-2 / 8 experts = 256 rows per expert and GPU, capped at 64
    shard = m.model_copy(update={"local_experts": m.num_experts // ep})
    assert expert_rows(m, tokens) == 64
    assert expert_rows(shard, tokens) == 64 * ep
    uncapped = load_model("mixtral-8x7b")
    loose = uncapped.model_copy(update={"local_experts": uncapped.num_experts // ep})
    assert expert_rows(loose, tokens) == 256 * ep  # no cap: unchanged

    w = Workload(batch=1, seq=tokens, framework="megatron", dtype=Dtype.BF16)

    def expert_flops(e: int) -> float:
        s = shard_model(m, RunConfig(tp=1, pp=1, dp=8, ep=e, micro_batch_size=1))
        layer = {b.name: b for b in inventory(s, w)}["layer"]
        return sum(k.flops() for op in layer.ops for k in op.fw if k.family is OpFamily.LINEAR)

    assert expert_flops(ep) == pytest.approx(expert_flops(1), rel=1e-12)


def test_a_model_file_cannot_set_the_shards_local_experts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """2109b44 added `ModelSpec.local_experts` for the simulator to set on a shard, but a model
    TOML could set it too: ``local_experts = 3`` on Mixtral loaded, and predict ran 3 of the 8
    experts (megatron bf16 forward on an A100: 6.04 ms, 7.15 ms without it). It is refused in
    one line naming the field, exit 2; the simulator's own shards still carry it."""
    from simulator.cli import main
    from simulator.errors import ConfigError

    text = (ROOT / "simulator" / "data" / "models" / "mixtral-8x7b.toml").read_text()
    path = tmp_path / "mix.toml"
    path.write_text(text + "local_experts = 3\n")
    with pytest.raises(ConfigError, match="local_experts"):
        load_model(path)
    argv = ["predict", "--model", str(path), "--gpu", "a100-sxm4-80gb", "--batch", "1"]
    argv += ["--seq", "512", "--mode", "inf", "--latency-model", "roofline", "--json"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "'local_experts'" in err
    m = load_model("mixtral-8x7b")
    shard = shard_model(m, RunConfig(tp=1, pp=1, dp=8, ep=4, micro_batch_size=1))
    assert (m.local_experts, shard.local_experts) == (0, 2)
