import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from csvrows import small_csv as _small_csv  # noqa: E402


@pytest.fixture
def small_csv(tmp_path):
    return _small_csv(tmp_path)
