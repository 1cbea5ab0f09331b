"""Joint search over parallelism and cluster provisioning (docs/search-space.md).

space.py (YAML -> SearchSpace), candidates.py (grid / random with cheap pruning), optuna_study.py
(ask/tell), context.py (what a worker evaluates), executor.py (serial and Ray; the only Ray import),
driver.py (run, resume, Ctrl-C), results.py / pareto.py / analysis.py / summary.py / plots.py (outputs).
"""

import sys
import types


class _CallableModule(types.ModuleType):
    """`comet.search` is both this package and the API function `comet.search(space, ...)`: importing the
    package binds it as the attribute `comet.search`, so the package itself forwards calls to the API."""

    def __call__(self, *args, **kwargs):
        from comet.api import search
        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
