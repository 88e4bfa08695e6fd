"""Dependency direction (STYLE.md section 2): forecast and topologies <- simulator <- scenarios.

forecast imports nothing of ours; topologies nothing of ours; simulator not scenarios.
Only forecast/profile.py (GPU timing) and simulator/sweep.py (Ray) may import CUDA timing or Ray.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "forecast": {"simulator", "topologies", "scenarios"},
    "topologies": {"forecast", "simulator", "scenarios"},
    "simulator": {"scenarios"},
    "scenarios": set(),
}
RAY_ALLOWED = {"simulator/sweep.py"}


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_direction(package: str) -> None:
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in FORBIDDEN[package], f"{path.relative_to(ROOT)} imports {name}"
            rel = str(path.relative_to(ROOT))
            if top == "ray":
                assert rel in RAY_ALLOWED, f"{rel} imports ray; only {RAY_ALLOWED} may"
