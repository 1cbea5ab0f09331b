"""Pareto mask against the O(n^2) definition, ties, inf and NaN included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from comet.search.pareto import pareto_mask, to_minimize


def brute_force(values: np.ndarray, maximize: list[bool]) -> np.ndarray:
    v = to_minimize(values, maximize)
    n = len(v)
    mask = np.ones(n, dtype=bool)
    for i in range(n):
        for j in range(n):
            if i != j and np.all(v[j] <= v[i]) and np.any(v[j] < v[i]):
                mask[i] = False
                break
    return mask


# few distinct values, so ties are common; inf, -inf and NaN mixed in
VALUES = st.sampled_from([0.0, 1.0, 2.0, 3.0, float("inf"), float("-inf"), float("nan")])


@st.composite
def problems(draw):
    k = draw(st.integers(1, 3))
    n = draw(st.integers(0, 25))
    rows = draw(st.lists(st.lists(VALUES, min_size=k, max_size=k), min_size=n, max_size=n))
    maximize = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    return np.array(rows, dtype=float).reshape(n, k), maximize


@settings(max_examples=400, deadline=None)
@given(problems())
def test_mask_equals_brute_force(problem):
    values, maximize = problem
    np.testing.assert_array_equal(pareto_mask(values, maximize), brute_force(values, maximize))


def test_hand_example():
    # (time, cost), both minimized: (1,3) (2,2) (3,1) trade off; (3,3) is dominated; the tie (2,2) stays twice
    v = np.array([[1, 3], [2, 2], [3, 1], [3, 3], [2, 2]], dtype=float)
    assert pareto_mask(v).tolist() == [True, True, True, False, True]


def test_maximize_and_nan_is_worst():
    v = np.array([[0.5], [0.7], [np.nan]])      # MFU, maximized
    assert pareto_mask(v, [True]).tolist() == [False, True, False]
    assert pareto_mask(np.array([[np.nan], [np.nan]]), [False]).tolist() == [True, True]
