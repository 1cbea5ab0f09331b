"""Fixtures for trace tests: the shared real traces (../shared/traces) and tiny synthetic Kineto traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"


@pytest.fixture(scope="session")
def traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip("../shared/traces not found (real profiler trace fixtures live next to the repo)")
    return TRACES.resolve()


@pytest.fixture(scope="session")
def counts(traces) -> dict:
    return json.loads((traces / "COUNTS.json").read_text())
