"""comet's numba kernels are stamped with every source they compile in (comet/replay/kernel_cache.py): a
change to a helper or a constant in another file recompiles them instead of loading stale machine code."""

from __future__ import annotations

import pytest

from comet.replay import kernel_cache
from comet.replay.kernels import HAVE_NUMBA

stamp = kernel_cache.sources_stamp.__wrapped__     # uncached: the files below change within the test


def _tree(root, files: dict[str, str]):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_stamp_follows_every_depended_on_source_and_nothing_else(tmp_path):
    _tree(tmp_path, {"replay/k.py": "A = 1\n", "graph/op_table.py": "MEMORY = 2\n", "cli/main.py": "x = 1\n"})
    folders = ("replay", "graph")
    before = stamp(tmp_path, folders)
    assert stamp(tmp_path, folders) == before
    (tmp_path / "cli/main.py").write_text("x = 2\n")          # not compiled into any kernel
    assert stamp(tmp_path, folders) == before
    (tmp_path / "graph/op_table.py").write_text("MEMORY = 3\n")  # a constant a kernel freezes
    changed = stamp(tmp_path, folders)
    assert changed != before
    (tmp_path / "graph/new_module.py").write_text("")          # a file added
    assert stamp(tmp_path, folders) != changed


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed: no kernel cache")
def test_comet_kernels_use_the_stamped_locator_and_other_files_do_not():
    from numba.core.caching import CacheImpl

    from comet.replay import block_kernel
    kernel_cache.install()             # idempotent: kernels.py installed it on import
    comet_locators = [cls for cls in CacheImpl._locator_classes if getattr(cls, "_comet", False)]
    assert len(comet_locators) == 2 and CacheImpl._locator_classes[:2] == comet_locators
    locator = block_kernel._replay_tables._cache._impl._locator
    assert getattr(locator, "_comet", False)
    assert locator.get_source_stamp() == kernel_cache.sources_stamp()
    assert all(cls.from_function(pytest.approx, pytest.__file__) is None for cls in comet_locators)
