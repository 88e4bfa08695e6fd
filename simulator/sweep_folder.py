"""A sweep's output folder: its default path, the fingerprint that lets a rerun resume its
rows, the resolved scenario written into it, and the checks that refuse, before any work, a
folder the sweep (or ``tilesim plot``) could not write its files into.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from forecast.files import write_text_atomic
from simulator.errors import ConfigError, check_writable_above
from simulator.report import RANKING_NAMES, RANKINGS, TOP_K
from simulator.rows import PROGRESS, PROGRESS_META, code_fingerprint
from simulator.scenario import Scenario
from simulator.space import Space

FIGURES = ("top_layouts", "pareto", "scaling", "procurement")  # `plots.PLOTS` (a test checks)
FIGURE_FILES = tuple(f"{f}.png" for f in FIGURES)
# what a finished sweep writes from its rows (`remove_results` clears them)
RESULTS = ("report.md", "rows.jsonl", "rows.parquet", "rows.csv", *FIGURE_FILES)
OUTPUTS = (PROGRESS, PROGRESS_META, "scenario.resolved.json", *RESULTS)


def digest(scenario: Scenario) -> str:
    """A short hash of everything the scenario (with its --set overrides) asks for."""
    dump = scenario.model_dump(mode="json", exclude={"base_dir"})
    if dump["reliability"] is None:  # the folders of sweeps from before the table keep theirs
        del dump["reliability"]
    return hashlib.sha256(json.dumps(dump, sort_keys=True).encode()).hexdigest()[:10]


def _slug(name: str) -> str:
    """``name`` as one safe folder name: no separators, no leading dots (``../../x`` is ``x``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip(".-") or "study"


def default_out_dir(scenario: Scenario) -> Path:
    """``results/<study>/<hash>/``: the folder of a sweep run without ``--out``."""
    return Path("results") / _slug(scenario.study.name) / digest(scenario)


def _input_files(scenario: Scenario) -> list[Path]:
    """The files (not catalog ids) the scenario's GPU, server, network and model keys name."""
    names: list[object] = [scenario.cluster.gpu, scenario.cluster.server, scenario.cluster.network]
    for opt in scenario.sweep.get("options") or []:
        if isinstance(opt, dict):
            names += [opt.get(k) for k in ("gpu", "server", "network")]
    m = scenario.model
    names.append(m.id)
    if m.hf_config is not None:
        hf = Path(m.hf_config)
        names.append(hf if hf.is_absolute() else Path(scenario.base_dir) / hf)
    paths = {Path(n) for n in names if isinstance(n, str | Path) and str(n)}
    return sorted(p for p in paths if p.suffix in (".toml", ".json") and p.is_file())


def inputs_digest(scenario: Scenario, space: Space) -> str:
    """A short hash of what the scenario reads besides itself: the bytes of its input files
    (a GPU TOML edited between two runs must not resume the old rows) and the resolved GPU,
    model and cluster of every context (which also covers files those name in turn)."""
    h = hashlib.sha256()
    for path in _input_files(scenario):
        h.update(str(path.resolve()).encode() + b"\0" + path.read_bytes())
    for c in space.contexts:
        for spec in (c.inputs.gpu, c.inputs.model, c.inputs.cluster.spec):
            h.update(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode())
    return h.hexdigest()[:10]


def fingerprint(scenario: Scenario, space: Space) -> str:
    """What a rerun must share with the rows in the folder to resume them: the same code,
    scenario and input files."""
    return f"{code_fingerprint()}-{digest(scenario)}-{inputs_digest(scenario, space)}"


def write_resolved(scenario: Scenario, space: Space, out: Path, rank: str, top: int) -> None:
    """Write ``scenario.resolved.json``: the scenario, its model and contexts, the layouts, and
    the ranking and ``--top`` that `tilesim plot DIR` redraws with."""
    contexts = [
        {
            "id": c.id,
            "gpu": c.inputs.gpu.name,
            "server": c.server,
            "network": c.network,
            "num_gpus": c.inputs.num_gpus,
            "price_per_gpu_hour": c.price_per_gpu_hour,
            "power_w_per_gpu": c.power_w_per_gpu,
        }
        for c in space.contexts
    ]
    resolved = {
        "scenario": scenario.model_dump(mode="json"),
        "model": space.contexts[0].inputs.model.model_dump(mode="json"),
        "contexts": contexts,
        "layouts": len(space.points),
        "pruned": space.pruned,
        "pruned_by": {rule: n for rule, n, _ in space.pruned_by},
        "rank": rank,  # `tilesim plot DIR` redraws with the sweep's own ranking
        "top": top,  # and as many top layouts as its report lists
    }
    text = json.dumps(resolved, indent=1, allow_nan=False) + "\n"
    write_text_atomic(out / "scenario.resolved.json", text)


def _resolved(out: Path) -> dict[str, Any]:
    """``out``'s scenario.resolved.json, or {} when it is missing or unreadable."""
    try:
        doc = json.loads((out / "scenario.resolved.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _report_match(out: Path, pattern: str) -> str | None:
    """The first group of ``pattern`` on a line of ``out``'s report.md (the sweep's own words
    where scenario.resolved.json is gone: a folder copied without it), or None."""
    try:
        text = (out / "report.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    found = re.search(pattern, text, flags=re.MULTILINE)
    return found.group(1).strip() if found else None


def sweep_rank(out: Path) -> str:
    """The ``--rank`` the sweep in ``out`` ran with (its scenario.resolved.json, else its
    report's "Ranked by"), else tokens: a ``--rank cost`` sweep's figures were redrawn ranked
    by tokens/s."""
    rank = _resolved(out).get("rank")
    if rank not in RANKINGS:
        said = _report_match(out, r"Ranked by (.+?) \(simulated layouts only\)")
        rank = next((k for k, name in RANKING_NAMES.items() if name == said), "tokens")
    return str(rank)


def sweep_study(out: Path) -> str:
    """The name of the study whose sweep is in ``out`` (its scenario.resolved.json, else its
    report's "# Sweep: NAME" heading), else "": the figures' titles name it, and a redraw of a
    folder without scenario.resolved.json named none."""
    scenario = _resolved(out).get("scenario")
    study = scenario.get("study") if isinstance(scenario, dict) else None
    name = study.get("name") if isinstance(study, dict) else None
    if isinstance(name, str) and name:
        return name
    return _report_match(out, r"\A# Sweep: (.+)$") or ""


def sweep_top(out: Path) -> int:
    """The ``--top`` the sweep in ``out`` ran with (its scenario.resolved.json, else its
    report's "## Top N" heading, N being the layouts it lists), else `TOP_K`."""
    top = _resolved(out).get("top")
    if isinstance(top, int) and not isinstance(top, bool) and top >= 1:
        return top
    said = _report_match(out, r"^## Top (\d+)$")
    return int(said) if said and int(said) >= 1 else TOP_K


def remove_results(out: Path, names: Sequence[str] = RESULTS) -> None:
    """Remove the files of ``names`` a sweep left in ``out``: results of another scenario
    (a log started afresh) were kept beside the new log until the new ones replaced them, and
    for good where the new sweep drew no figure or was interrupted (`check_out` has refused
    anything there but files)."""
    for name in names:
        (out / name).unlink(missing_ok=True)


def check_files(out: Path, names: Sequence[str], where: str) -> None:
    """Refuse a folder (or anything but a file) where the command will write one of ``names``
    (it failed only after the whole sweep had run)."""
    for name in names:
        path = out / name
        if (path.exists() or path.is_symlink()) and not path.is_file():
            raise ConfigError(f"{where}: {path} is not a file (a folder?); remove it")


def check_out(out: Path) -> None:
    """Refuse up front an output folder that cannot be made (a file is there, or the nearest
    existing parent is not a writable folder), instead of a traceback mid-sweep."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: a file is there; give a folder path")
    check_writable_above(out, f"--out {out}")
    check_files(out, OUTPUTS, f"--out {out}")
