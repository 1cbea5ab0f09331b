"""Pareto mask over objective columns (minimize after flipping maximized ones).

A point is dominated when another is no worse in every objective and strictly better in one.
NaN counts as the worst value (+inf after flipping); equal points do not dominate each other, so ties
all stay on the front. O(n log n + n * front) by sorting on the first objective.
"""

from __future__ import annotations

import numpy as np


def to_minimize(values: np.ndarray, maximize: list[bool] | tuple[bool, ...]) -> np.ndarray:
    """Copy with maximized columns negated and NaN replaced by +inf (the worst)."""
    v = np.array(values, dtype=float, copy=True)
    if v.ndim == 1:
        v = v[:, None]
    for j, is_max in enumerate(maximize):
        if is_max:
            v[:, j] = -v[:, j]
    v[np.isnan(v)] = np.inf
    return v


def pareto_mask(values: np.ndarray, maximize: list[bool] | tuple[bool, ...] | None = None) -> np.ndarray:
    """Boolean mask of the non-dominated rows of `values` (n x k)."""
    v = np.asarray(values, dtype=float)
    if v.ndim == 1:
        v = v[:, None]
    v = to_minimize(v, maximize or [False] * v.shape[1])
    n = v.shape[0]
    mask = np.zeros(n, dtype=bool)
    if n == 0:
        return mask
    # perf: lexicographic sort, then each row is checked only against the front found so far; a row
    # can be dominated only by rows sorted before it (lexicographically smaller or equal).
    order = np.lexsort(v.T[::-1])
    front = np.empty_like(v)       # perf: the front so far, compared with each row in one numpy step
    found: list[int] = []
    for i in order:
        row = v[i]
        f = front[:len(found)]
        if not (np.all(f <= row, axis=1) & np.any(f < row, axis=1)).any():
            front[len(found)] = row
            found.append(i)
    mask[found] = True
    return mask
