"""Joint search over parallelism and cluster provisioning (docs/search-space.md).

space.py (YAML -> SearchSpace), candidates.py (grid / random with cheap pruning), optuna_study.py
(ask/tell), context.py (what a worker evaluates), executor.py (serial and Ray; the only Ray import),
driver.py (run, resume, Ctrl-C), results.py / pareto.py / analysis.py / summary.py / plots.py (outputs).
"""
