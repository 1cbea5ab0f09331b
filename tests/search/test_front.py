"""Front views: equivalent designs merged (only when every objective and the layout agree), top-N per
objective always holding each objective's best, summary sections in order."""

import pandas as pd

from comet.search.front import merge_equivalent, top_per_objective
from comet.search.space import parse_space

SPACE = {"study": "s", "model": "gpt_1_7b", "job": {"global_batch": 16}, "cluster": {"spec": "x.yaml"},
         "objectives": [{"time_to_train": "min"}, {"cost_per_run": "min"}]}


def _row(t, c, label="tp1-pp1-dp8-mb1-none-z1-bf16", bw=100.0, gpus=8):
    return {"time_to_train_days": t, "cost_per_run_usd": c, "label": label, "offload": "none", "gpus": gpus,
            "expansion_GB": 512.0, "expansion_bandwidth_GBps": bw, "key": f"{t}-{c}-{label}-{bw}"}


def test_merge_only_designs_equal_on_every_objective_and_layout():
    space = parse_space(SPACE, "s.yaml")
    front = pd.DataFrame([_row(1.0, 9.0, bw=100.0), _row(1.0, 9.0, bw=200.0),     # bandwidth changes nothing
                          _row(1.0, 9.0, label="tp2-pp1-dp4-mb1-none-z1-bf16"),   # another layout: kept
                          _row(2.0, 5.0, bw=200.0)])
    merged = merge_equivalent(front, space)
    assert len(merged) == 3
    first = merged.iloc[0]
    assert first["designs"] == 2 and first["equivalent"] == "expansion_bandwidth_GBps: 100, 200"
    assert (merged.iloc[1:]["equivalent"] == "").all()


def test_top_per_objective_keeps_each_best():
    space = parse_space(SPACE, "s.yaml")
    front = pd.DataFrame([_row(float(i), float(10 - i), bw=float(i)) for i in range(1, 10)])
    top = top_per_objective(front, space, 2)
    assert set(top["time_to_train_days"]) == {1.0, 2.0, 8.0, 9.0}
    assert top.iloc[0]["best_for"] == "time_to_train" and top.iloc[-1]["best_for"] == "cost_per_run"
