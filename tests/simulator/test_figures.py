"""Figure outputs: a path that cannot take a figure is refused before any work, and a figure
is written whole or not at all."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.figures import save_figure


@pytest.mark.parametrize(
    "argv",
    [
        ["collective-plot", "--data", "{tmp}", "--out"],
        ["kernels", "plot", "--data", "{tmp}", "--out"],
        ["validate", "e2e", "--data", "{tmp}", "--plot"],
    ],
)
def test_a_figure_under_a_file_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """A figure path below a file raised FileExistsError from mkdir, after the work."""
    (tmp_path / "labels").mkdir()
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv] + [str(blocker / "sub" / "f.png")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "afile is not a writable folder" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "labels"]


def test_a_figure_that_fails_to_write_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(self: Figure, fname: Any, **kwargs: Any) -> None:
        if hasattr(fname, "write"):  # a buffer (save_figure renders to memory first)
            fname.write(b"\x89PNG half")
        else:
            Path(fname).write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", disk_full)
    fig, _ = plt.subplots()
    with pytest.raises(ConfigError, match=r"cannot write the figure .*f\.png: No space left"):
        save_figure(fig, tmp_path / "f.png")
    assert list(tmp_path.iterdir()) == []
