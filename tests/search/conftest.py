"""Shared fixtures for the search tests: the repository root and the tiny space."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import search_fakes as fakes
from search_fakes import ROOT, TINY


@pytest.fixture(autouse=True)
def _reset_interrupt():
    """The fake evaluator's interrupt counter starts and ends every search test unset."""
    fakes.INTERRUPT_AFTER.update(n=None, count=0)
    yield
    fakes.INTERRUPT_AFTER.update(n=None, count=0)


@pytest.fixture
def tiny_raw() -> dict:
    return yaml.safe_load(TINY.read_text())


@pytest.fixture
def write_space(tmp_path):
    """Write a space mapping to tmp_path/name.yaml (cluster spec path made absolute)."""
    def write(raw: dict, name: str = "space.yaml") -> Path:
        raw = dict(raw)
        if isinstance(raw.get("cluster"), dict) and "spec" in raw["cluster"]:
            raw["cluster"] = dict(raw["cluster"], spec=str(ROOT / "cluster_specs" / "h100_dgx.yaml"))
        path = tmp_path / name
        path.write_text(yaml.safe_dump(raw))
        return path
    return write
