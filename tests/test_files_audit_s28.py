"""Files a user writes instead of catalog ids, after an audit of them (2026-12-08): GPU files
whose fields cannot hold together, device sheets of HBM GPUs, relative paths inside scenario
and server files, HF activations, and the one-line messages of a wrong type."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from forecast.gpus import CATALOG_DIR, GPUError, load_gpu
from simulator.cli import main
from simulator.errors import ConfigError
from simulator.models import CATALOG_DIR as MODELS_DIR
from simulator.models import DEFAULT_DATA_DIR as NEUSIGHT
from simulator.models import load_model
from topologies.catalog import DATA_DIR as TOPOLOGY_DIR
from topologies.catalog import SERVERS_DIR

H100 = CATALOG_DIR / "h100-sxm5-80gb.toml"
TINY = Path(__file__).resolve().parents[1] / "scenarios" / "tiny_gpt_8gpu.toml"


def _edited(tmp_path: Path, pattern: str, repl: str, name: str = "gpu.toml") -> Path:
    text = H100.read_text()
    new = re.sub(pattern, repl, text, count=1, flags=re.M)
    assert new != text, pattern
    path = tmp_path / name
    path.write_text(new)
    return path


@pytest.mark.parametrize(
    ("pattern", "repl", "says"),
    [
        # TFLOP/s where FLOP/s belong: a 4096^3 bf16 GEMM read 174 million seconds
        (r"^bf16 = .*$", "bf16 = 989.5", "'peak_flops_per_s.bf16' is 989.5 FLOP/s, under the"),
        # under the FP32 peak: bf16 76x slower than FP32
        (r"^bf16 = .*$", "bf16 = 1e12", "under the FP32 peak"),
        # 256 dedicated of 128 lanes: an FP32 GEMM at 183% of the file's FP32 peak
        (
            r"^fp32_dedicated_lanes_per_sm = .*$",
            "fp32_dedicated_lanes_per_sm = 256",
            "'fp32_dedicated_lanes_per_sm' (256) must be at most fp32_lanes_per_sm (128)",
        ),
        ('^compute_capability = "9.0"', 'compute_capability = "sm_90"', "MAJOR.MINOR"),
        ('^compute_capability = "9.0"', "compute_capability = 9", "a string in quotes, got 9"),
    ],
)
def test_gpu_fields_that_cannot_hold_together_are_refused(
    tmp_path: Path, pattern: str, repl: str, says: str
) -> None:
    path = _edited(tmp_path, pattern, repl)
    with pytest.raises(GPUError) as e:
        load_gpu(str(path))
    assert says in str(e.value) and str(path) in str(e.value)
    assert len(str(e.value).splitlines()) == 1


def test_every_catalog_gpu_still_loads() -> None:
    from forecast.gpus import catalog, list_gpus

    assert len(catalog()) == len(list_gpus()) >= 20


@pytest.mark.skipif(not (NEUSIGHT / "devices").is_dir(), reason=f"no NeuSight data at {NEUSIGHT}")
@pytest.mark.parametrize(
    ("sheet", "gpu"),
    [
        ("NVIDIA_H100_80GB_HBM3.json", "h100-sxm5-80gb"),
        ("NVIDIA_A100_80GB_PCIe.json", "a100-pcie-80gb"),
        ("NVIDIA_A100-PCIE-40GB.json", "a100-pcie-40gb"),
    ],
)
def test_an_hbm_device_sheet_holds_the_catalogs_memory(sheet: str, gpu: str) -> None:
    """The H100 sheet's Dev_Mem 80 was read as 80e9 bytes: 73.5 usable GiB against the
    catalog H100's 79, and a layout that fits one did not fit the other."""
    assert load_gpu(str(NEUSIGHT / "devices" / sheet)).hbm_bytes == load_gpu(gpu).hbm_bytes


@pytest.fixture
def elsewhere(tmp_path: Path) -> Iterator[Path]:
    """A scenario in sub/ naming hw/gpu.toml, a model file and a server whose default network
    is a file beside it; the current folder is another one."""
    sub = tmp_path / "sub"
    (sub / "hw").mkdir(parents=True)
    shutil.copy(H100, sub / "hw" / "gpu.toml")
    server = (SERVERS_DIR / "dgx-h100.toml").read_text()
    server = re.sub(r"^default_network = .*$", 'default_network = "net.toml"', server, flags=re.M)
    (sub / "hw" / "server.toml").write_text(server)
    shutil.copy(TOPOLOGY_DIR / "networks" / "ib-ndr.toml", sub / "hw" / "net.toml")
    (sub / "models").mkdir()
    shutil.copy(MODELS_DIR / "tiny-gpt.toml", sub / "models" / "m.toml")
    text = TINY.read_text()
    text = text.replace('gpu = "a100-sxm4-80gb"', 'gpu = "hw/gpu.toml"')
    text = text.replace('server = "dgx-a100"', 'server = "hw/server.toml"')
    text = text.replace('network = "ib-hdr"\n', "")
    (sub / "s.toml").write_text(text)
    other = tmp_path / "other"
    other.mkdir()
    cwd = Path.cwd()
    os.chdir(other)
    try:
        yield sub / "s.toml"
    finally:
        os.chdir(cwd)


def test_paths_in_a_scenario_and_a_server_file_are_read_beside_them(
    elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From another folder the same scenario failed: the server's default_network path was
    read from the current folder, and the error blamed cluster.network, a key never set."""
    assert main(["simulate", str(elsewhere)]) == 0
    assert " on 8 x gpu, " in capsys.readouterr().out  # hw/gpu.toml (its stem is its id)
    # model.id as a path, from the scenario's folder too (it was read from the current one)
    text = re.sub(
        r"\[model\]\n(.*\n)*?seq_len",
        '[model]\nid = "models/m.toml"\nseq_len',
        elsewhere.read_text(),
    )
    elsewhere.write_text(text)
    assert main(["simulate", str(elsewhere), "--json"]) == 0
    capsys.readouterr()


def test_a_missing_relative_file_names_both_folders(
    elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", str(elsewhere), "--set", "cluster.gpu=hw/nope.toml"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "cluster.gpu: file hw/nope.toml is neither in the scenario's folder" in err
    assert str(elsewhere.parent / "hw" / "nope.toml") in err and str(Path.cwd()) in err


@pytest.mark.skipif(not (NEUSIGHT / "models").is_dir(), reason=f"no NeuSight data at {NEUSIGHT}")
def test_a_gpt2_configs_activation_is_read_or_refused(tmp_path: Path) -> None:
    """Any activation_function but gelu_new was read as gelu without a word."""
    raw = json.loads((NEUSIGHT / "models" / "gpt2_large.json").read_text())
    path = tmp_path / "c.json"
    for given, priced in (("gelu_new", "gelu_new"), ("relu", "relu"), ("gelu", "gelu")):
        path.write_text(json.dumps(raw | {"activation_function": given}))
        assert load_model(path).activation == priced
    path.write_text(json.dumps(raw | {"activation_function": "quick_gelu"}))
    with pytest.raises(ConfigError, match="'activation_function' is \"quick_gelu\"; tilesim"):
        load_model(path)


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ('cluster.num_gpus="16"', 'must be a whole number, got "16"; write it without quotes'),
        ("cluster.num_gpus=16.5", "must be a whole number, got 16.5"),
        ("run.sequence_parallel=3", "must be true or false, got 3"),
        # an empty network fell back to the server's default without a word
        ('cluster.network=""', "must not be empty"),
    ],
)
def test_a_value_of_the_wrong_type_says_what_it_must_be(
    setting: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "Input should be a valid integer" named neither the value nor the fix."""
    assert main(["simulate", str(TINY), "--set", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err


def test_a_runs_files_paths_are_read_beside_it(
    elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A runs file's relative GPU path was read from the current folder only."""
    runs = elsewhere.parent / "runs.jsonl"
    line = {"model": "models/m.toml", "gpu": "hw/gpu.toml", "batch": 1, "seq": 128}
    runs.write_text(json.dumps(line | {"mode": "inf"}) + "\n")
    assert main(["predict", "--runs", str(runs)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["line"] == 1 and out["e2e_ms"] > 0


def test_a_misspelt_model_file_key_is_named_with_the_field_it_resembles(tmp_path: Path) -> None:
    """It said "field 'num_layers': Field required", not that the file's num_layer was it."""
    path = tmp_path / "m.toml"
    path.write_text((MODELS_DIR / "tiny-gpt.toml").read_text().replace("num_layers", "num_layer"))
    with pytest.raises(ConfigError, match="field 'num_layer' is not a model field; did you mean"):
        load_model(path)


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("foo.bar=1", "--set foo.bar=1: key 'foo' is not a scenario key"),  # blamed the file
        ("model.n_heads=7", "model.n_heads: 7 heads do not divide"),  # said "model: 7 heads"
    ],
)
def test_an_error_names_the_set_or_the_key_it_came_from(
    setting: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", str(TINY), "--set", setting]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("model_type", "config", "params"),
    [
        # Mistral-7B-v0.1's config.json: 7.24e9 parameters (its model card)
        (
            "mistral",
            {
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 32000,
                "max_position_embeddings": 32768,
                "sliding_window": 4096,
                "tie_word_embeddings": False,
            },
            7.24e9,
        ),
        # Qwen2-7B's config.json: 7.62e9 parameters (q/k/v biases, 0.4M, not counted here)
        (
            "qwen2",
            {
                "hidden_size": 3584,
                "intermediate_size": 18944,
                "num_hidden_layers": 28,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "vocab_size": 152064,
                "max_position_embeddings": 131072,
                "use_sliding_window": False,
                "tie_word_embeddings": False,
            },
            7.62e9,
        ),
    ],
)
def test_mistral_and_qwen2_configs_read_as_llamas(
    tmp_path: Path, model_type: str, config: dict[str, object], params: float
) -> None:
    """They were "unsupported model_type": both are Llama's layer (RMSNorm, rotary, SwiGLU,
    grouped-query attention)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, **config}))
    m = load_model(path)
    assert (m.architecture, m.activation, m.norm, m.position) == (
        "llama",
        "swiglu",
        "rmsnorm",
        "rotary",
    )
    assert m.num_params() == pytest.approx(params, rel=0.005)
