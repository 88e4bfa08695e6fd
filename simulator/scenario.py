"""A distributed-training scenario: the TOML schema, ``--set`` overrides and resolution.

Tables: ``[study]`` (name), ``[model]`` (``id``, ``hf_config`` or inline sizes; ``seq_len``
always), ``[cluster]`` (gpu, server, network, num_gpus, gpus_per_node, nics_per_node,
nodes_per_leaf, oversubscription), ``[training]`` (global_batch_size, dtype, framework,
attention), ``[run]`` (one `RunConfig`) and an optional ``[sweep]`` (lists, read by the sweep).
Every table forbids unknown keys; errors name the key (``run.tpp``) and the rule, as one line.
The ``[model]`` and ``[cluster]`` tables are `simulator.model_section` and
`simulator.cluster_section`. `resolve` turns ids into objects (`SimInputs`); nothing here
simulates.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from forecast.files import read_toml
from forecast.flash_attention import FLASH_ATTENTION_AMD_ISAS, has_flash_attention
from forecast.gpus import GPUError, GPUSpec, load_gpu
from forecast.kernels import Dtype
from simulator.cluster_section import ClusterSection, beside_scenario, resolve_cluster
from simulator.errors import ConfigError, pydantic_msg
from simulator.memory import RESERVED_BYTES
from simulator.model_section import INLINE_KEYS, ModelSection, inline_model
from simulator.models import ModelSpec, load_model
from simulator.opgraph import MAX_TOKENS, default_attention
from simulator.parallel import RunConfig
from simulator.reliability_section import ReliabilitySection
from topologies import Cluster, TopologyError

# strict: a TOML ``true`` or ``2.0`` is not a GPU count, nor ``"yes"`` a switch
_FROZEN = ConfigDict(frozen=True, extra="forbid", strict=True)


class StudySection(BaseModel):
    """What the study is."""

    model_config = _FROZEN
    name: str = Field(
        min_length=1, description="the study's name; a sweep writes to results/<name>/<hash>/"
    )
    description: str = Field(default="", description="free text for the report")

    @field_validator("name")
    @classmethod
    def _one_line(cls, name: str) -> str:
        # a newline in it made the report a second heading and split the simulate summary
        if "|" in name or not name.isprintable():
            raise ValueError(f"{name!r}: give one line without '|', e.g. \"gpt3-175b-h100\"")
        return name


Attention = Literal["flash", "unfused"]


class TrainingSection(BaseModel):
    """Batch, precision and op inventory.

    ``attention`` (``megatron`` only): ``flash`` = FlashAttention (no score matrix in DRAM),
    ``unfused`` = QK^T, scale-mask-softmax, dropout and AV with the ``b*a/t*s*s`` scores in
    DRAM (Megatron-LM before FlashAttention, 2019-22; any fp32 run); ``auto`` = flash for
    16- and 8-bit dtypes, unfused for fp32/tf32 (FlashAttention has no fp32 kernels).
    ``hf-eager`` is always unfused.
    """

    model_config = _FROZEN
    global_batch_size: int = Field(gt=0, description="sequences per optimizer step")
    dtype: Dtype = Field(default=Dtype.BF16, description="training precision", strict=False)
    framework: Literal["megatron", "hf-eager"] = Field(
        default="megatron", description="op inventory: Megatron-LM's fused kernels or HF eager"
    )
    attention: Literal["auto", "flash", "unfused"] = Field(
        default="auto",
        description="megatron only: flash (FlashAttention), unfused (scores through DRAM, as "
        "Megatron-LM before 2022); auto: flash for 16/8-bit dtypes, unfused for fp32/tf32",
    )
    latency_model: Literal["auto", "roofline", "roofline-derated", "tile-mlp"] = Field(
        default="auto",
        description="kernel forecaster (auto: tile-mlp for fp32, the tensor-core and "
        "bandwidth models for other dtypes)",
    )
    memory_reserved_gib: float = Field(
        default=RESERVED_BYTES / 2**30,
        ge=0,
        le=1024,
        allow_inf_nan=False,
        description="GiB kept free on every GPU for the CUDA context and library workspaces; "
        "raise it (e.g. 4-8) for the caching allocator's fragmentation, which is not modelled",
    )


class Scenario(BaseModel):
    """One scenario file, validated; paths in it are relative to ``base_dir``."""

    model_config = _FROZEN
    study: StudySection
    model: ModelSection
    cluster: ClusterSection
    training: TrainingSection
    run: RunConfig = RunConfig()
    sweep: dict[str, list[Any]] = Field(default_factory=dict)
    reliability: ReliabilitySection | None = None
    base_dir: str = "."


@dataclass(frozen=True)
class SimInputs:
    """Everything a layout is simulated against, resolved once per scenario."""

    name: str
    model: ModelSpec
    seq_len: int
    gpu: GPUSpec
    cluster: Cluster
    num_gpus: int
    global_batch_size: int
    dtype: Dtype
    framework: Literal["megatron", "hf-eager"]
    latency_model: str
    attention: Attention = "flash"
    reserved_bytes: float = RESERVED_BYTES  # kept free on every GPU (training.memory_reserved_gib)


def _set(raw: dict[str, Any], assignment: str) -> str:
    """Apply one ``--set TABLE.KEY=VALUE`` to ``raw``; the key it set (``TABLE.KEY``)."""
    key, sep, text = assignment.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        raise ConfigError(f"--set {assignment!r}: use TABLE.KEY=VALUE, e.g. run.tp=8")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    table = raw.setdefault(parts[0], {})
    if not isinstance(table, dict):
        raise ConfigError(f"--set {assignment!r}: {parts[0]} is not a table")
    table[parts[1]] = value
    return ".".join(parts)


def parse_scenario(
    raw: dict[str, Any], *, source: str, base_dir: Path, overridden: dict[str, str] | None = None
) -> Scenario:
    """Validate a scenario mapping; the first problem becomes one `ConfigError` line, which
    names ``source`` (the file), or the ``--set`` that gave the key (``overridden``: key ->
    its assignment)."""
    if "base_dir" in raw:  # set from the file's folder; one in the file was silently dropped
        raise ConfigError(
            f"{source}: key 'base_dir': not a scenario key (paths in a scenario are relative "
            "to its own folder); remove it"
        )
    try:
        return Scenario.model_validate({**raw, "base_dir": str(base_dir)})
    except ValidationError as e:
        # an unknown key first: a misspelt one also leaves the key it meant missing, and
        # "key 'study': Field required" did not say that the file's [studyx] was the typo
        errors = e.errors()
        first = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
        loc = ".".join(str(x) for x in first["loc"])
        # the --set of this key (TABLE.KEY), or of a key in the unknown table it made (foo
        # of --set foo.bar=1)
        key = ".".join(str(x) for x in first["loc"][:2])
        sets = (overridden or {}).items()
        given = next((a for k, a in sets if k == key or k.startswith(f"{loc}.")), None)
        if given is not None:  # the value came from the command line, not the file
            source = f"--set {given}"
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"{source}: {_unknown_key(first['loc'])}") from e
        raise ConfigError(f"{source}: key {loc!r}: {pydantic_msg(first)}") from e


def _unknown_key(loc: tuple[int | str, ...]) -> str:
    """``key 'K' is not a scenario key``, with ``did you mean`` the closest key its table
    takes (if one is close) and the pointer to `tilesim list keys`."""
    model: Any = Scenario
    for part in loc[:-1]:  # the table the key sits in: a pydantic model, else no suggestion
        field = getattr(model, "model_fields", {}).get(part)
        model = field.annotation if field is not None else None
    known = list(getattr(model, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), [k for k in known if k != "base_dir"], n=1)
    key = ".".join(map(str, loc))
    mean = f"; did you mean {'.'.join(map(str, (*loc[:-1], close[0])))!r}?" if close else ""
    return f"key {key!r} is not a scenario key{mean} (`tilesim list keys` prints every key)"


def load_scenario(path: str | Path, *, overrides: tuple[str, ...] = ()) -> Scenario:
    """Read a scenario TOML and apply ``--set TABLE.KEY=VALUE`` overrides in order."""
    path = Path(path)
    raw = read_toml(path, "scenario", ConfigError)
    overridden = {_set(raw, assignment): assignment for assignment in overrides}
    return parse_scenario(
        raw, source=str(path), base_dir=path.resolve().parent, overridden=overridden
    )


def resolve_model(s: Scenario) -> ModelSpec:
    """The `ModelSpec` a scenario names (catalog id, HF config path, or inline)."""
    m = s.model
    if m.id is not None and m.hf_config is not None:
        raise ConfigError("model: give one of id and hf_config, not both")
    inline = sorted(k for k in INLINE_KEYS if getattr(m, k) != ModelSection.model_fields[k].default)
    if (m.id is not None or m.hf_config is not None) and inline:
        which = "id" if m.id is not None else "hf_config"
        raise ConfigError(
            f"model: {which} names the whole model; drop the inline key(s) {', '.join(inline)} "
            "or drop model." + which
        )
    key = f"model.{'id' if m.id is not None else 'hf_config'}"
    named = m.id if m.id is not None else m.hf_config
    if named is not None:  # a path from the scenario's folder, as the cluster's files
        ref = beside_scenario(s.base_dir, named, key)
        try:
            return load_model(ref if m.id is not None else Path(ref))
        except ConfigError as e:  # the loader's text did not say which key named the model
            raise ConfigError(f"{key}: {e}") from e
    return inline_model(m, s.study.name)


def resolve_attention(t: TrainingSection, gpu: GPUSpec) -> Attention:
    """The attention implementation a training section runs on ``gpu`` (see
    `TrainingSection`): ``auto`` is unfused where FlashAttention-2 has no kernels
    (`has_flash_attention`: below sm80, MI100) and under hf-eager, and ``flash`` there is
    refused."""
    if t.framework == "hf-eager":
        if t.attention == "flash":  # it was ignored: the eager loop has no FlashAttention
            raise ConfigError(
                "training.attention: flash, but framework hf-eager runs eager (unfused) "
                'attention; use auto or unfused, or framework = "megatron"'
            )
        return "unfused"
    if t.attention == "flash" and default_attention(t.dtype) != "flash":
        raise ConfigError(  # it was priced with fp32 flash kernels that do not exist
            f"training.attention: flash, but FlashAttention has no {t.dtype} kernels (fp16, "
            "bf16 and fp8 only); use auto or unfused, or a 16- or 8-bit training.dtype"
        )
    flash_ok = has_flash_attention(gpu)
    if t.attention == "auto":
        return default_attention(t.dtype) if flash_ok else "unfused"
    if t.attention == "flash" and not flash_ok:
        raise ConfigError(
            f"training.attention: flash, but FlashAttention-2 has no kernels for {gpu.name} "
            f"(compute capability {gpu.compute_capability}; it needs 8.0+ or AMD "
            f"{'/'.join(sorted(FLASH_ATTENTION_AMD_ISAS))}): "
            "use auto or unfused"
        )
    return t.attention


def check_tokens(seq_len: int, run: RunConfig) -> None:
    """A `ConfigError` naming the keys when one micro-batch holds more tokens per GPU than are
    modelled (`opgraph.MAX_TOKENS`): before any work, instead of a traceback from inside it."""
    tokens = run.micro_batch_size * (seq_len // run.cp)
    if tokens > MAX_TOKENS:
        raise ConfigError(
            f"micro_batch_size {run.micro_batch_size} x model.seq_len {seq_len} / cp {run.cp} "
            f"= {tokens:.3g} tokens per micro-batch; at most {MAX_TOKENS:.3g} (2^40) are "
            "modelled: lower model.seq_len or micro_batch_size"
        )


def resolve(s: Scenario) -> SimInputs:
    """Load the model, GPU and cluster a scenario names; unknown ids become `ConfigError`."""
    try:
        gpu = load_gpu(beside_scenario(s.base_dir, s.cluster.gpu, "cluster.gpu"))
    except GPUError as e:
        raise ConfigError(f"cluster.gpu: {e}") from e
    try:  # "dtype fp8: ..." named no key (the flag of `kernels predict` is --dtype)
        gpu.peak_for(s.training.dtype)
    except GPUError as e:
        raise ConfigError(f"training.{e}") from e
    try:
        cluster = resolve_cluster(s.cluster, s.base_dir)
    except TopologyError as e:  # not the server's or network's file (those name their key)
        raise ConfigError(f"cluster: {e}") from e
    model = resolve_model(s)
    try:
        model.check_sequence(s.model.seq_len)
    except ConfigError as e:
        raise ConfigError(f"model.seq_len: {e}") from None
    return SimInputs(
        name=s.study.name,
        model=model,
        seq_len=s.model.seq_len,
        gpu=gpu,
        cluster=cluster,
        num_gpus=s.cluster.num_gpus,
        global_batch_size=s.training.global_batch_size,
        dtype=s.training.dtype,
        framework=s.training.framework,
        latency_model=s.training.latency_model,
        attention=resolve_attention(s.training, gpu),
        reserved_bytes=s.training.memory_reserved_gib * 2**30,
    )
