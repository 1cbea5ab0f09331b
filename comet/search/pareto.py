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
    front: list[int] = []
    for i in order:
        row = v[i]
        dominated = False
        for j in front:
            other = v[j]
            if np.all(other <= row) and np.any(other < row):
                dominated = True
                break
        if not dominated:
            front.append(i)
    mask[front] = True
    return mask
