"""Reading one model file into a `ModelSpec`: a TOML file, a Hugging Face ``config.json``.

Every failure is one `ConfigError` line naming the file and the field to fix (or the HF
config's own key for it, `hf_config.KEYS`). `models.load_model` picks the file by id or path.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from forecast.files import read_toml
from simulator.errors import ConfigError
from simulator.model_shapes import ShapeError
from simulator.models import ModelSpec


def validate_model(
    raw: dict[str, Any], source: str, keys: dict[str, str] | None = None
) -> ModelSpec:
    """`ModelSpec` of ``raw`` or one `ConfigError` line naming the field to fix; ``keys`` maps
    `ModelSpec` fields to the file's own key names (an HF config's ``n_embd``)."""
    try:
        return ModelSpec.model_validate(raw)
    except ValidationError as e:
        errors = e.errors()
        # an unknown key first, with the field it resembles: a misspelt required field is
        # both unknown and missing, and only the unknown key names what the user typed
        unknown = [x for x in errors if x["type"] == "extra_forbidden" and len(x["loc"]) == 1]
        if unknown and keys is None:
            key = str(unknown[0]["loc"][0])
            fields = [f for f in ModelSpec.model_fields if f != "id"]
            near = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
            fix = f"did you mean {near[0]!r}?" if near else f"fields: {', '.join(fields)}"
            raise ConfigError(f"{source}: field {key!r} is not a model field; {fix}") from e
        first = errors[0]
        error = first.get("ctx", {}).get("error")
        if isinstance(error, ShapeError):
            field, msg = error.field, str(error)
        else:
            got = "" if first["type"] == "missing" else f", got {first['input']!r}"
            field, msg = ".".join(str(x) for x in first["loc"]), first["msg"] + got
        if keys is None:
            raise ConfigError(f"{source}: field {field!r}: {msg}") from e
        raise ConfigError(f"{source}: key {keys.get(field, field)!r}: {msg}") from e


def model_from_toml(path: Path) -> ModelSpec:
    """The model of a TOML file; its id defaults to the file's stem."""
    raw = read_toml(path, "model file", ConfigError)
    raw.setdefault("id", path.stem)
    return validate_model(raw, str(path))


def read_hf_json(path: Path) -> dict[str, Any]:
    """The JSON object of an HF config file."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # ValueError: bad JSON or not UTF-8
        raise ConfigError(f"cannot read HF config {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: an HF config is a JSON object")
    return raw
