"""TableWriter.array and array_of_edges (np.fromiter over the pieces) equal numpy's conversion of the one list, bit for bit."""

import numpy as np
from hypothesis import given, settings, strategies as st

from comet.graph.op_table import HEADER, ROW_WIDTH, GEMM_WIDTH, TableWriter, tables_of

_NUMBER = st.one_of(st.integers(-2**80, 2**80), st.integers(0, 1 << 20),
                    st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(_NUMBER, max_size=12 * ROW_WIDTH), st.lists(st.integers(1, 2**62), max_size=6 * GEMM_WIDTH),
       st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500)), max_size=40))
def test_array_equals_numpy_conversion_of_the_list(rows, gemms, edges):
    writer = TableWriter()
    writer.rows += rows
    writer.gemms += gemms
    sources, targets = [u for u, _ in edges], [v for _, v in edges]
    table = writer.array(sources, targets)
    reference = np.array([len(rows) // ROW_WIDTH, len(gemms) // GEMM_WIDTH, len(sources), *rows, *gemms, *sources,
                          *targets], dtype=np.float64)
    assert table.dtype == np.float64 and len(table) == HEADER + len(rows) + len(gemms) + 2 * len(edges)
    assert table.tobytes() == reference.tobytes()
    with_dependencies = [(u, v, "data") for u, v in edges]    # a Block's edges
    assert writer.array_of_edges(with_dependencies).tobytes() == reference.tobytes()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(_NUMBER, max_size=4 * ROW_WIDTH), st.lists(st.integers(1, 2**62), max_size=2 * GEMM_WIDTH),
                          st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=8)), max_size=5))
def test_tables_laid_end_to_end_equal_each_converted_apart(blocks):
    """tables_of (one conversion for several blocks) equals each block's array, concatenated, and says
    where each starts."""
    pairs = []
    for rows, gemms, edges in blocks:
        writer = TableWriter()
        writer.rows += rows
        writer.gemms += gemms
        pairs.append((writer, [(u, v, "data") for u, v in edges]))
    joined, starts = tables_of(pairs)
    apart = [writer.array_of_edges(edges) for writer, edges in pairs]
    assert joined.tobytes() == b"".join(a.tobytes() for a in apart)
    assert starts == [sum(len(a) for a in apart[:k]) for k in range(len(apart))]
