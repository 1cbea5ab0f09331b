"""Views of a study's Pareto front for people: equivalent designs merged, sorted per objective, and an
optional top-N per objective that always keeps each objective's best.

Two front designs are equivalent when they run the same parallel layout and reach the same value on
every objective, differing only in provisioning axes that change nothing (e.g. the bandwidth of an
expansion tier nothing is offloaded to, when its price is per GB). They are shown once, with the axes
that do not matter and their values ("expansion_bandwidth_GBps: 100, 200").
"""

from __future__ import annotations

import pandas as pd

from comet.search.context import PROVISION_KEYS
from comet.search.space import Direction, Objective, SearchSpace

DESIGN_AXES = ("gpus",) + PROVISION_KEYS + ("tp", "pp", "dp", "cp", "vpp", "sequence_parallel", "schedule",
                                            "micro_batch", "recompute", "zero", "precision", "offload")
REL_TOL_DIGITS = 9   # objective values equal to 9 significant digits count as equal


def sort_by(df: pd.DataFrame, objective: Objective, then: tuple[Objective, ...] = ()) -> pd.DataFrame:
    """Best first on `objective`; ties broken by the `then` objectives in order."""
    order = [objective] + [o for o in then if o is not objective]
    return df.sort_values([o.column for o in order], ascending=[o.direction is Direction.MIN for o in order],
                          kind="stable")


def merge_equivalent(front: pd.DataFrame, space: SearchSpace) -> pd.DataFrame:
    """One row per group of equivalent designs, with `equivalent` ("" or the axes that do not matter and
    their values) and `designs` (how many were merged). Keeps the front's order."""
    if front.empty:
        return front.assign(equivalent=pd.Series(dtype=str), designs=pd.Series(dtype=int))
    objs = [o.column for o in space.objectives]
    key = front[objs].apply(lambda c: c.map(lambda v: float(f"{v:.{REL_TOL_DIGITS}g}")))
    for col in ("label", "offload"):
        if col in front:
            key[col] = front[col].astype(str)
    groups = key.astype(str).agg("|".join, axis=1)
    axes = [c for c in DESIGN_AXES if c in front.columns]
    text = {c: front[c].astype(str).tolist() for c in axes}   # perf: one conversion, not one per group
    first, equivalent, designs = [], [], []
    for _, pos in groups.groupby(groups, sort=False).indices.items():
        differ = [c for c in axes if len({text[c][i] for i in pos}) > 1]
        first.append(pos[0])
        equivalent.append("; ".join(
            f"{c}: " + ", ".join(_fmt(v) for v in sorted(front[c].iloc[pos].dropna().unique(), key=_sort_key))
            for c in differ))
        designs.append(len(pos))
    # perf: the first row of each group taken as a block (a row Series per group, then a frame rebuilt from
    # them, took ~0.1 s of a gpt3_1t summary and re-inferred every column's dtype)
    return front.iloc[first].assign(equivalent=equivalent, designs=designs)


def top_per_objective(front: pd.DataFrame, space: SearchSpace, n: int) -> pd.DataFrame:
    """The union of each objective's n best front rows (each objective's best always in), with
    `best_for` naming the objectives a row is among the top n of; ordered by the first objective."""
    tags: dict = {}
    for o in space.objectives:
        for i in sort_by(front, o, space.objectives).index[:n]:
            tags.setdefault(i, []).append(o.metric.value)
    picked = front.loc[list(tags)].assign(best_for=[", ".join(tags[i]) for i in tags])
    return sort_by(picked, space.objectives[0], space.objectives)


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _sort_key(v):
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))
