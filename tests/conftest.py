"""Fixtures for every test folder."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    """Close the figures a test kept open (`support.drawn` keeps them to inspect): they piled
    up across the session past matplotlib's 20-figure warning."""
    yield
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close("all")
