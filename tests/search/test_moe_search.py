"""A search over expert x tensor x pipeline parallelism for a MoE model (search_spaces/qwen3_30b_moe.yaml)
returns a Pareto front whose designs use expert parallelism, with the expert all-to-all in the breakdown."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from comet.cli import main

SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "qwen3_30b_moe.yaml"


def test_moe_search_over_ep_tp_pp_returns_a_pareto_front(tmp_path, capsys):
    code = main(["search", str(SPACE), "--executor", "serial", "--out", str(tmp_path), "--no-timelines"])
    assert code == 0 and "Pareto set" in capsys.readouterr().out
    df = pd.read_parquet(tmp_path / "candidates.parquet")
    ok = df[df["status"] == "ok"]
    assert set(ok["ep"]) >= {4, 8, 16} and set(ok["tp"]) >= {1, 2} and set(ok["pp"]) >= {1, 2}
    assert (ok["breakdown.exposed_ep"] > 0).any()
    parts = ok[[c for c in ok.columns if c.startswith("breakdown.")]].sum(axis=1)
    assert (abs(parts - ok["step_time_s"]) <= 1e-6 * ok["step_time_s"]).all()
    pareto = pd.read_csv(tmp_path / "pareto.csv")
    assert len(pareto) >= 1 and (pareto["ep"] > 1).all()
