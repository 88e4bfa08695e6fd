"""Fixtures for topologies tests: the shared hardware folder (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[3] / "shared"
HARDWARE = SHARED / "data" / "hardware"


@pytest.fixture
def hardware_dir() -> Path:
    if not HARDWARE.is_dir():
        pytest.skip(f"shared hardware data not found at {HARDWARE} (checkout without ../shared)")
    return HARDWARE
