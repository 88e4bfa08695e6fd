"""Scenario inputs found by a user-path hunt: each is one line naming the TOML key, exit 2,
before any work (a huge cluster ran out of memory, ids did not say which key named them, an
ignored key passed without a word)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.scenario import load_scenario, resolve
from simulator.space import enumerate_space, find_scenario
from tests.support import error_line

TINY = find_scenario("tiny-gpt-8gpu")
HUGE = 2**30  # rank groups of 2^30 GPUs took longer than a minute and many GB, then died


def test_a_huge_cluster_is_refused_by_key(capsys: pytest.CaptureFixture[str]) -> None:
    sets = [f"cluster.num_gpus={HUGE}", f"training.global_batch_size={HUGE}", "run.dp=0"]
    with pytest.raises(ConfigError, match=r"cluster\.num_gpus"):
        load_scenario(TINY, overrides=tuple(sets))
    argv = ["simulate", str(TINY), *(x for s in sets for x in ("--set", s))]
    assert main(argv) == 2
    error_line(capsys, "cluster.num_gpus", "1048576")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (f"sweep.world_size=[8, {HUGE}]", "sweep.world_size"),
        (f"sweep.options=[{{id='a', num_gpus=[{HUGE}]}}]", "sweep.options[0].num_gpus"),
    ],
)
def test_a_huge_swept_cluster_is_refused_by_key(override: str, key: str) -> None:
    """It was pruned (the tiny global batch does not split over it) or, with a batch that
    does, ran out of memory."""
    scenario = load_scenario(TINY, overrides=(override,))
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: "):
        enumerate_space(scenario)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ('cluster.gpu="no-such-gpu"', "cluster.gpu: unknown GPU"),
        ('cluster.server="no-such-server"', "cluster.server: unknown server"),
        ('cluster.network="no-such-net"', "cluster.network: unknown network"),
    ],
)
def test_an_unknown_cluster_id_names_its_key(override: str, key: str) -> None:
    """They all said "cluster: unknown ...", not which of the keys named it."""
    with pytest.raises(ConfigError, match=rf"^{key}"):
        resolve(load_scenario(TINY, overrides=(override,)))


def test_an_unknown_model_names_its_key(tmp_path: Path) -> None:
    text = TINY.read_text()
    for key in ("n_layers", "hidden_size", "n_heads", "vocab_size"):
        text = "\n".join(x for x in text.splitlines() if not x.startswith(f"{key} ="))
    for key, value in (("id", "no-such-model"), ("hf_config", "missing.json")):
        path = tmp_path / f"{key}.toml"
        path.write_text(text.replace("[model]", f'[model]\n{key} = "{value}"'))
        with pytest.raises(ConfigError, match=rf"^model\.{key}: "):
            resolve(load_scenario(path))


def test_an_inline_model_rule_reads_without_pydantic_prefix() -> None:
    with pytest.raises(ConfigError, match=r"^model\.n_heads: 7 heads do not divide"):
        resolve(load_scenario(TINY, overrides=("model.n_heads=7",)))


def test_flash_attention_under_hf_eager_is_refused_not_ignored() -> None:
    """``attention = "flash"`` with ``framework = "hf-eager"`` ran unfused attention silently."""
    sets = ("training.framework='hf-eager'", "training.attention='flash'")
    with pytest.raises(ConfigError, match=r"^training\.attention: flash, but framework hf-eager"):
        resolve(load_scenario(TINY, overrides=sets))
    unfused = ("training.framework='hf-eager'", "training.attention='unfused'")
    assert resolve(load_scenario(TINY, overrides=unfused)).attention == "unfused"


def test_per_node_counts_are_checked_as_a_server_file_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`model_copy` skipped `ServerSpec`'s checks: 3 NICs for 8 GPUs were priced as shares."""
    assert main(["simulate", str(TINY), "--set", "cluster.nics_per_node=3"]) == 2
    error_line(capsys, "cluster.gpus_per_node/nics_per_node", "nics_per_node = 3")


def test_a_mesh_cut_to_fewer_gpus_keeps_the_links_among_them() -> None:
    """A mesh server's edges naming GPUs past the new count are dropped, not refused."""
    sc = load_scenario(
        TINY,
        overrides=(
            'cluster.server="dgx1-v100"',
            'cluster.gpu="v100-sxm2-32gb"',
            "cluster.gpus_per_node=4",
            'training.dtype="fp16"',
        ),
    )
    server = resolve(sc).cluster.server
    assert server.gpus_per_node == 4
    assert server.mesh_edges and all(max(e) < 4 for e in server.mesh_edges)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("run.tp=0",), "--set run.tp=0: key 'run.tp': "),
        (("run.tp=2", "run.tp=-1"), "--set run.tp=-1: key 'run.tp': "),  # the one that holds
        (("run.tpp=2",), "--set run.tpp=2: key 'run.tpp' is not a scenario key; did you mean"),
    ],
)
def test_a_bad_value_from_set_names_the_set_not_the_file(
    overrides: tuple[str, ...], message: str
) -> None:
    """It named the scenario file: "tiny_gpt_8gpu.toml: key 'run.tp': ...", a value the file
    did not hold."""
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        load_scenario(TINY, overrides=overrides)


def test_a_bad_value_in_the_file_still_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(TINY.read_text().replace("tp = 2", "tp = 0"))
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: key 'run.tp'"):
        load_scenario(path, overrides=("run.pp=2",))


def test_expert_parallelism_on_a_dense_model_says_to_set_ep_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", str(TINY), "--set", "run.ep=2"]) == 2
    error_line(capsys, "run.ep: ", "this model is dense", "set run.ep = 1")
