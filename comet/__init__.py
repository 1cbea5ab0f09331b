"""comet: plan large LLM training runs by replaying execution graphs on a cluster model.

Data flow (see docs/design.md): config -> execution graph (built or imported) -> transform ->
compile -> replay on the cluster model -> memory / cost -> results.

Python API (docs/api.md): `comet.estimate(...)` -> Result, `comet.search(...)` -> SearchResults.
Importing comet stays light: Ray, Optuna and matplotlib load only when a search runs.
"""

__version__ = "0.1.0"

from comet.api import SearchResults, estimate            # noqa: E402 - after __version__ (the CLI reads it)
# `comet.search` is the search package, made callable: comet.search(space, ...) runs comet.api.search
import comet.search                                       # noqa: E402
from comet.errors import CometError, ConfigError         # noqa: E402
from comet.result import CandidateStatus, Result         # noqa: E402

__all__ = ["CandidateStatus", "CometError", "ConfigError", "Result", "SearchResults", "__version__", "estimate",
           "search"]
