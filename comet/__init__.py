"""comet: plan large LLM training runs by replaying execution graphs on a cluster model.

Data flow (see docs/design.md): config -> execution graph (built or imported) -> transform ->
compile -> replay on the cluster model -> memory / cost -> results.
"""

__version__ = "0.1.0"
