"""The study's drawn outputs, plots and timelines, as (file name, bytes) made by `executor.side`: on the
serial executor at once in this process; on Ray as tasks on the workers, which are idle once the last
chunk is back, while the driver writes the tables (the driver writes every file). Each function takes
the study's context first (what a worker holds) and is importable by the workers.
"""

from __future__ import annotations

import pandas as pd

from comet.search.context import Candidate, EvalContext, evaluate_candidate
from comet.search.space import Direction, SearchSpace


def prepare(ctx: EvalContext) -> None:
    """Imports the outputs need (matplotlib is ~0.3 s), run on each Ray worker as it runs out of chunks."""
    import comet.replay.timeline  # noqa: F401
    import comet.search.plots  # noqa: F401


# perf: the breakdown plot costs about as much as the other two together (matplotlib lays out and draws
# its ten two-line labels glyph by glyph): two tasks that two workers draw side by side
PLOT_TASKS = (("breakdown_top.png",), ("pareto.png", "heatmap_tp_pp.png"))


def plot_files(ctx: EvalContext, names: tuple[str, ...], df: pd.DataFrame, front: pd.DataFrame,
               space: SearchSpace) -> list[tuple[str, bytes]]:
    from comet.search.plots import render_plots
    return render_plots(df, front, space, names)


def timeline_designs(space: SearchSpace, front: pd.DataFrame, df: pd.DataFrame, model: str,
                     cluster: str) -> list[tuple[str, str, dict]]:
    """(file name, candidate key, trace metadata) of the best `space.timelines` distinct designs by the
    first objective, each named by its full design (cluster and layout)."""
    from comet.search.analysis import cluster_columns
    from comet.search.naming import design_name, design_slug

    first = space.objectives[0]
    varying = cluster_columns(df)
    ranked = front.sort_values(first.column, ascending=first.direction is Direction.MIN)
    distinct = ranked.drop_duplicates(subset=[o.column for o in space.objectives])
    return [(f"{rank:02d}_{design_slug(row, varying)}.json.gz", row["key"],
             {"design": design_name(row), "model": model, "cluster": cluster, f"rank by {first.column}": rank})
            for rank, (_, row) in enumerate(distinct.head(space.timelines).iterrows(), start=1)]


def timeline_file(ctx: EvalContext, cand: Candidate, meta: dict) -> bytes | None:
    """The gzip Chrome trace of one design's task-level timeline (None when its evaluation gave none)."""
    from comet.replay.timeline import chrome_trace_bytes
    result = evaluate_candidate(ctx, cand, timeline=True)
    return chrome_trace_bytes(result.timeline, meta, compress=True) if result.timeline else None
