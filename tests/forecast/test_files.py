"""Whole-file writes: a result is all there or not touched, never half-written."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from forecast.files import write_text_atomic, write_together
from forecast.predict import WEIGHTS_DIR
from forecast.tile_mlp import TileMLPModel


def test_an_interrupted_set_leaves_the_old_files_and_no_temporary(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    write_text_atomic(a, "old a")
    write_text_atomic(b, "old b")

    def interrupted(path: Path) -> None:
        path.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_together([(a, lambda p: p.write_text("new a")), (b, interrupted)])
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]
    write_together([(a, lambda p: p.write_text("new a")), (b, lambda p: p.write_text("new b"))])
    assert (a.read_text(), b.read_text()) == ("new a", "new b")


@pytest.mark.skipif(not (WEIGHTS_DIR / "model.json").is_file(), reason="no trained weights")
def test_saved_weights_reload_and_equal_the_committed_bytes(tmp_path: Path) -> None:
    model = TileMLPModel.load()
    model.save(tmp_path)
    for name in ("bmm.pt", "linear.pt", "softmax.pt", "model.json"):  # torch names its archive
        assert filecmp.cmp(tmp_path / name, WEIGHTS_DIR / name, shallow=False), name
    again = TileMLPModel.load(tmp_path)
    assert again.picker.tables.keys() == model.picker.tables.keys()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
