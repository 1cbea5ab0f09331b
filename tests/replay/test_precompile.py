"""`python -m comet.replay.precompile` (the Makefile's install step) compiles the kernels a search uses
into numba's cache. Run in-process: with the cache warm (as under the test suite, after the first run)
it loads them and compiles nothing."""

from __future__ import annotations

import pytest
from numba.core import event

from comet.replay import block_kernel, compute_costs, precompile


class _Compiled(event.Listener):
    """The kernels numba compiles (not loads from its cache) while installed."""

    def __init__(self):
        self.names: list[str] = []

    def on_start(self, ev):
        pass

    def on_end(self, ev):
        self.names.append(ev.data["dispatcher"].py_func.__qualname__)


@pytest.mark.skipif(not block_kernel.HAVE_NUMBA, reason="numba not installed: nothing to compile")
def test_precompile_covers_its_own_kernels_and_compiles_nothing_the_second_time(capsys):
    assert precompile.main() == 0
    assert "replay kernels ready" in capsys.readouterr().out
    # the entry points the engine calls from Python have a signature: the block replay (from tables and
    # from ops) and the compute cost model (block_exposure.exposure is compiled into the replay's callers:
    # its own dispatcher has one only where numba compiled a caller in this process)
    for kernel in (block_kernel._replay_tables, block_kernel.replay_summary, compute_costs.kernel_times):
        assert kernel.signatures, kernel.py_func.__name__
    compiled = _Compiled()
    with event.install_listener("numba:compile", compiled):
        assert precompile.precompile() == len(precompile.CONFIGURATIONS)
    assert compiled.names == []
