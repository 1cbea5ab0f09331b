"""Driver mechanics with a fake evaluate (fakes.py): results written as they arrive, Ctrl-C, resume
without re-evaluating, a torn journal line, and Optuna ask/tell with constraints."""

from __future__ import annotations

import gzip
import json

import optuna
import pandas as pd

import search_fakes as fakes
from comet.search.driver import RunOptions, run_study
from comet.search.results import JOURNAL
from comet.search.space import parse_space

from search_fakes import ROOT

TINY_SOURCE = str(ROOT / "search_spaces" / "tiny.yaml")


def _opts(out, **kw) -> RunOptions:
    return RunOptions(out=out, executor="serial", evaluate_fn=fakes.fake_evaluate, precheck_fn=fakes.fake_precheck,
                      chunk_size=4, **kw)


def _metrics(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["key", "status", "reason", "step_time_s", "time_to_train_days", "cost_per_run_usd"]
    return df[cols].sort_values("key").reset_index(drop=True)


def test_interrupt_then_resume_matches_an_uninterrupted_run(tiny_raw, tmp_path):
    space = parse_space(tiny_raw, TINY_SOURCE)
    full = run_study(space, _opts(tmp_path / "full"))
    assert not full.interrupted and full.evaluated_now == 32 and full.resumed == 0

    fakes.INTERRUPT_AFTER.update(n=10, count=0)          # Ctrl-C during the 11th evaluation
    cut = run_study(space, _opts(tmp_path / "cut"))
    assert cut.interrupted
    assert cut.evaluated_now == 8                        # two whole chunks of 4 reached the journal
    assert not (tmp_path / "cut" / JOURNAL).exists()           # folded into the compressed journal
    lines = gzip.decompress((tmp_path / "cut" / f"{JOURNAL}.gz").read_bytes()).decode().splitlines()
    assert len(lines) == 8
    assert (tmp_path / "cut" / "candidates.parquet").exists()   # flushed to parquet on Ctrl-C too
    assert (tmp_path / "cut" / "summary.md").read_text().count("interrupted") == 1

    fakes.INTERRUPT_AFTER.update(n=None, count=0)
    again = run_study(space, _opts(tmp_path / "cut"))
    assert not again.interrupted
    assert again.resumed == 8 and again.evaluated_now == 24     # finished candidates are not evaluated again
    pd.testing.assert_frame_equal(_metrics(again.frame), _metrics(full.frame))

    third = run_study(space, _opts(tmp_path / "cut"))
    assert third.evaluated_now == 0 and third.resumed == 32


def test_torn_journal_line_is_evaluated_again(tiny_raw, tmp_path):
    space = parse_space(tiny_raw, TINY_SOURCE)
    run_study(space, _opts(tmp_path, timelines=False))
    path, packed = tmp_path / JOURNAL, tmp_path / f"{JOURNAL}.gz"
    lines = gzip.decompress(packed.read_bytes()).decode().splitlines()
    packed.unlink()            # a run killed before compacting leaves only the plain journal ...
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])   # ... torn mid-write
    again = run_study(space, _opts(tmp_path, timelines=False))
    assert again.evaluated_now == 1 and again.resumed == 31 and len(again.frame) == 32
    for line in gzip.decompress(packed.read_bytes()).decode().splitlines():
        json.loads(line)      # the compacted journal holds whole lines only


def test_outputs_written(tiny_raw, tmp_path):
    out = run_study(parse_space(tiny_raw, TINY_SOURCE), _opts(tmp_path))
    names = {p.name for p in tmp_path.iterdir()}
    assert {"candidates.parquet", "candidates.csv.gz", "pareto.csv", "study.yaml", "summary.md", "pareto.png",
            "heatmap_tp_pp.png", "breakdown_top.png", "timelines", f"{JOURNAL}.gz"} <= names
    df = pd.read_parquet(tmp_path / "candidates.parquet")
    assert len(df) == 32 and set(df["status"]) == {"ok", "infeasible"}
    assert (df.loc[df.status == "infeasible", "reason"] == "activations do not fit memory").all()
    front = pd.read_csv(tmp_path / "pareto.csv")
    assert len(front) == len(out.front) > 0 and (front["status"] == "ok").all()
    timeline = next((tmp_path / "timelines").iterdir())
    assert timeline.name.endswith(".json.gz") and "gpu_" in timeline.name   # named by cluster and layout
    trace = json.loads(gzip.decompress(timeline.read_bytes()))
    assert trace["traceEvents"][0]["ph"] == "X" and " GPUs" in trace["otherData"]["design"]
    for col in ("model", "global_batch", "total_tokens", "cluster", "hbm_GB", "scaleup_size", "expansion_GB",
                "scaleout_bandwidth_GBps", "compute_scale"):   # every row names its complete cluster and job
        assert df[col].notna().all(), col


def test_optuna_storage_shows_infeasible_trials_and_named_objectives(tiny_raw, tmp_path):
    tiny_raw.update(method="optuna-tpe", budget={"trials": 10}, batch=4)
    tiny_raw["parallel"]["tp"] = {"choices": [1, 2, 4]}      # tp*pp < 8 fails the fake memory check
    tiny_raw["parallel"]["pp"] = {"choices": [1, 2, 4, 8]}
    tiny_raw["constraints"] = {"max_cost_per_run_usd": 30000}   # a budget some designs with results break
    space = parse_space(tiny_raw, TINY_SOURCE)
    first = run_study(space, _opts(tmp_path, timelines=False))
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert study.metric_names == ["time_to_train", "cost_per_run"]
    states = {t.state for t in study.trials}
    assert optuna.trial.TrialState.FAIL not in states and optuna.trial.TrialState.RUNNING not in states
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned, "the fake memory check prunes tp*pp < 8: some trials must be infeasible"
    for t in study.trials:
        if t.state == optuna.trial.TrialState.PRUNED:   # infeasible: no values, a reason, a violation
            assert t.values is None and t.user_attrs["reason"] and t.constraints["violation"] > 0
        else:   # real objective values, never a placeholder; over budget: COMPLETE with a violation
            assert all(0 < v < 1e20 for v in t.values)
            assert (t.constraints["violation"] > 0) == (t.values[1] > 30000)
    counted = [t for t in study.trials if t.user_attrs.get("counted")]
    assert len(counted) == 10                             # the budget counts new evaluations only
    assert len({t.user_attrs["key"] for t in counted}) == 10
    assert all(not t.user_attrs.get("counted") for t in study.trials if t.user_attrs.get("duplicate_of"))
    trials_before = len(study.trials)
    again = run_study(space, _opts(tmp_path, timelines=False))
    assert again.evaluated_now == 0                             # budget already met: nothing new
    assert len(optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'optuna.db'}").trials) \
        == trials_before
    assert len(first.frame) == len(again.frame)


def test_random_method_respects_trials(tiny_raw, tmp_path):
    tiny_raw.update(method="random", budget={"trials": 7})
    out = run_study(parse_space(tiny_raw, TINY_SOURCE), _opts(tmp_path, timelines=False))
    assert out.evaluated_now == 7
    more = run_study(parse_space(tiny_raw, TINY_SOURCE), _opts(tmp_path, timelines=False, trials=9))
    assert more.resumed == 7 and more.evaluated_now == 2     # same seed: the same first 7, then 2 new


def test_wall_time_budget_stops_proposing(tiny_raw, tmp_path):
    tiny_raw["budget"] = {"wall_time_s": 1e-9}
    out = run_study(parse_space(tiny_raw, TINY_SOURCE), _opts(tmp_path, timelines=False))
    assert out.evaluated_now == 0 and not out.interrupted and out.budget_stop
    assert (tmp_path / "summary.md").exists()


def test_optuna_same_seed_same_trials(tiny_raw, tmp_path):
    tiny_raw.update(method="optuna-tpe", budget={"trials": 12}, batch=4, seed=7)
    tiny_raw["parallel"]["micro_batch"] = {"low": 1, "high": 4}
    space = parse_space(tiny_raw, TINY_SOURCE)
    runs = [run_study(space, _opts(tmp_path / name, timelines=False)) for name in ("a", "b")]
    a, b = (list(r.frame.sort_values("number")["key"]) for r in runs)
    assert a == b and len(a) > 0


def test_narrowed_space_reuses_results_and_reports_only_its_candidates(tiny_raw, tmp_path):
    run_study(parse_space(tiny_raw, TINY_SOURCE), _opts(tmp_path, timelines=False))
    tiny_raw["cluster"]["gpus"] = [64]
    narrow = run_study(parse_space(tiny_raw, TINY_SOURCE), _opts(tmp_path, timelines=False))
    assert narrow.evaluated_now == 0 and narrow.resumed == 16
    assert set(narrow.frame["gpus"]) == {64} and len(narrow.frame) == 16


def test_results_of_another_engine_version_are_not_resumed(tiny_raw, tmp_path, monkeypatch):
    """A changed engine (code or shipped data) invalidates the journal: its numbers would be stale."""
    import comet.search.driver as driver
    space = parse_space(tiny_raw, TINY_SOURCE)
    first = run_study(space, _opts(tmp_path, timelines=False))
    assert first.evaluated_now == 32
    monkeypatch.setattr(driver, "engine_fingerprint", lambda: "another-engine")
    again = run_study(space, _opts(tmp_path, timelines=False))
    assert again.resumed == 0 and again.evaluated_now == 32
