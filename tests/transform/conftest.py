"""Fixtures of the transformation tests: a small GPT (8 layers, hidden 1024: every tp in 1..8 and cp 2
divide it, replays take milliseconds)."""

import pytest

from comet.config.model import ModelSpec


@pytest.fixture(scope="session")
def small_model() -> ModelSpec:
    return ModelSpec(name="small", layers=8, hidden=1024, heads=16, vocab=8192, seq_len=1024)
