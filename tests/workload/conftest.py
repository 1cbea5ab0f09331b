"""Fixtures shared by the memory tests: a tiny untied model (hand-computable byte counts) and the H100 spec."""

from pathlib import Path

import pytest

from comet.config.cluster import load_cluster
from comet.config.model import ModelSpec

H100 = Path(__file__).resolve().parents[2] / "cluster_specs" / "h100_dgx.yaml"


@pytest.fixture(scope="module")
def tiny():
    return ModelSpec(name="tiny", layers=2, hidden=64, heads=4, vocab=1000, seq_len=128, ffn_hidden=256,
                     tied_embeddings=False, vocab_pad_to=1, linear_bias=False)


@pytest.fixture(scope="module")
def h100():
    return load_cluster(H100)
