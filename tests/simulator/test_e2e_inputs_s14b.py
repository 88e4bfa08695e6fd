"""Session 14b: hostile whole-model inputs.

* HF configs: an explicit ``num_key_value_heads`` or ``head_dim`` of 0 read as "absent"
  (multi-head attention, hidden / heads) where Hugging Face keeps the 0 and fails; a
  Switch config's ``num_layers`` of 0 blamed ``num_decoder_layers``, a key the file lacks,
  and an explicit ``num_decoder_layers`` of 0 became the encoder's layer count.
* ``--module``: what the user's file prints went to stdout ahead of ``--json``'s object.
* ``validate e2e``: a per-op trace that is not gzip, or lacks the time columns, was a
  traceback (``BadGzipFile``, ``KeyError: 'fw_latency'``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from simulator.label_trace import trace_backward_ms, trace_family_ms, trace_kernels
from tests.support import refused

LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
}
SWITCH = {
    "model_type": "switch_transformers",
    "num_layers": 2,
    "d_model": 256,
    "d_ff": 512,
    "num_heads": 4,
    "d_kv": 64,
    "vocab_size": 1000,
    "num_experts": 4,
}
RUN = ["--gpu", "a100-sxm4-80gb", "--batch", "1", "--seq", "16", "--mode", "inf", "--json"]


def _config(tmp_path: Path, raw: dict[str, object]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({**LLAMA, "num_key_value_heads": 0}, "'num_key_value_heads'"),
        ({**LLAMA, "head_dim": 0}, "'head_dim'"),
        ({**SWITCH, "num_layers": 0}, "'num_layers'"),
        ({**SWITCH, "num_decoder_layers": 0}, "'num_decoder_layers'"),
    ],
)
def test_zero_sizes_refused_by_their_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], raw: dict[str, object], key: str
) -> None:
    line = refused(["predict", "--model", _config(tmp_path, raw), *RUN], capsys, key)
    assert "num_decoder_layers" not in line or "num_decoder_layers" in raw


@pytest.mark.parametrize("raw", [{**LLAMA, "num_key_value_heads": None}, LLAMA, SWITCH])
def test_absent_or_null_sizes_still_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], raw: dict[str, object]
) -> None:
    from simulator.cli import main

    assert main(["predict", "--model", _config(tmp_path, raw), *RUN]) == 0
    assert json.loads(capsys.readouterr().out)["e2e_ms"] > 0


def test_module_prints_stay_off_json_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulator.cli import main

    path = tmp_path / "chatty.py"
    path.write_text(
        "import torch\nprint('importing')\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.l = torch.nn.Linear(8, 8)\n"
        "    def forward(self, x):\n"
        "        print('forward')\n"
        "        return self.l(x)\n"
        "def build(b, s):\n"
        "    print('building')\n"
        "    return M(), (torch.randn(b, s, 8),)\n"
    )
    assert main(["predict", "--module", f"{path}:build", *RUN]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["e2e_ms"] > 0  # one JSON object, nothing else
    assert "importing" in err and "building" in err and "forward" in err


def _gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt") as f:
        f.write(text)
    return path


@pytest.mark.parametrize(
    "make",
    [
        lambda p: (p.write_bytes(b"garbage\n"), p)[1],
        lambda p: (p.write_bytes(gzip.compress(b"op,meta\n" * 1000)[:40]), p)[1],
        lambda p: _gz(p, "a,b\n1,2\n"),
        lambda p: _gz(
            p,
            "op,target,meta,input_shapes,fw_latency,bw_latency,acc_latency\n"
            "call_module,x,'transformer.h.0',[[1]],abc,abc,abc\n",
        ),
    ],
    ids=["not-gzip", "truncated", "no-time-columns", "bad-number"],
)
def test_bad_trace_is_one_config_error(tmp_path: Path, make: object) -> None:
    from simulator.errors import ConfigError

    path = make(tmp_path / "run.csv.gz")  # type: ignore[operator]
    for read in (
        lambda: trace_family_ms(path, 2),
        lambda: trace_kernels(path),
        lambda: trace_backward_ms(path, frozenset({"Linear"})),
    ):
        with pytest.raises(ConfigError, match=r"run\.csv\.gz.*--data"):
            read()
