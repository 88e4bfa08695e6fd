"""topologies imports nothing from the project's other packages (STYLE.md section 2)."""

from __future__ import annotations

import ast
from pathlib import Path

import topologies

OURS = {"forecast", "simulator", "scenarios"}


def test_topologies_imports_nothing_of_ours() -> None:
    for path in Path(topologies.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in OURS, f"{path.name} imports {name}"
