"""Shared tiny fixtures: a 4-layer model, the H100 and A100 cluster specs, small parallel configs."""

from pathlib import Path

import pytest

from comet.config.cluster import load_cluster
from comet.config.model import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def h100():
    return load_cluster(ROOT / "cluster_specs" / "h100_dgx.yaml")


@pytest.fixture(scope="session")
def a100():
    return load_cluster(ROOT / "cluster_specs" / "a100_dgx.yaml")


@pytest.fixture(scope="session")
def tiny_model() -> ModelSpec:
    """4 layers, hidden 512, 8 heads: small enough to expand every op of a step."""
    return ModelSpec(name="tiny", layers=4, hidden=512, heads=8, vocab=4096, seq_len=256)


@pytest.fixture(scope="session")
def gpt3_175b():
    from comet.config.model import load_model
    return load_model("gpt3_175b")
