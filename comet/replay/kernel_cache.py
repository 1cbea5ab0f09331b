"""numba's on-disk cache, keyed on every source a compiled kernel depends on.

numba stamps a cached kernel with the hash of the one file that defines it. comet's kernels inline helpers
from other files (block_kernel compiles in block_pack's and block_exposure's) and freeze module constants
read from comet.graph and comet.hardware (op table codes, split-K limits) into the machine code. With
numba's own stamp, an upgrade that changed only one of those files would load the old kernel and give
other numbers, silently. Here the stamp of every comet kernel is the hash of all the sources it can
depend on: any change to them recompiles (about a minute after an upgrade; `make` does it at install).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

_COMET = Path(__file__).resolve().parents[1]
# where kernels are defined, and where the constants and helpers they compile in come from
DEPENDED_ON = ("replay", "graph", "hardware")


@functools.lru_cache(maxsize=1)
def sources_stamp(root: Path = _COMET, folders: tuple[str, ...] = DEPENDED_ON) -> str:
    """sha256 over the depended-on sources' names and contents (once per process: ~40 small files)."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted((root / folder).glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _is_comet_source(py_file: str) -> bool:
    try:
        return Path(py_file).resolve().is_relative_to(_COMET)
    except OSError:
        return False


def install() -> None:
    """Stamp comet's kernels with sources_stamp(): a locator ahead of numba's own two (a user-provided
    NUMBA_CACHE_DIR, then the __pycache__ beside the source), for comet's files only. Call before the
    first `@njit(cache=True)` runs (kernels.py does, on import)."""
    try:
        from numba.core.caching import CacheImpl, InTreeCacheLocator, UserProvidedCacheLocator
    except ImportError:     # numba missing, or a version whose cache is laid out otherwise: its own stamp
        return
    if any(getattr(cls, "_comet", False) for cls in CacheImpl._locator_classes):
        return

    def stamped(base):
        class Locator(base):
            _comet = True

            def get_source_stamp(self):
                return sources_stamp()

            @classmethod
            def from_function(cls, py_func, py_file):
                return super().from_function(py_func, py_file) if _is_comet_source(py_file) else None

        Locator.__name__ = Locator.__qualname__ = f"Comet{base.__name__}"
        return Locator

    CacheImpl._locator_classes[:0] = [stamped(UserProvidedCacheLocator), stamped(InTreeCacheLocator)]
