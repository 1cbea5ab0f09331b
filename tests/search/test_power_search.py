"""Power in the search: a power cap (constraints.max_power_kW) and energy / tokens per joule as objectives,
against hand-computed numbers for the DGX H100 spec (cluster_specs/h100_dgx.yaml: GPU 700 W, idle 75 W,
comm_activity 0.35, chassis 3700 W per 8 GPUs, network 60 W per GPU, PUE 1.2)."""

from __future__ import annotations

import optuna
import pandas as pd
import pytest

import search_fakes as fakes
from comet import cost
from comet.cli import main
from comet.config.cluster import load_cluster
from comet.config.job import JobSpec
from comet.errors import ConfigError
from comet.search.candidates import CandidateFactory, grid
from comet.search.driver import RunOptions, build_context, run_study
from comet.search.results import constraint_violation, meets_constraints
from comet.search.space import Direction, Metric, grid_size, parse_space

from search_fakes import ROOT

TINY_SOURCE = str(ROOT / "search_spaces" / "tiny.yaml")


@pytest.fixture
def dgx():
    return load_cluster(ROOT / "cluster_specs" / "h100_dgx.yaml")


def test_power_follows_utilisation_by_hand(dgx):
    # 60% of the step computing, 10% with only communication exposed, the rest idle in the bubble:
    # GPU 75 + (700 - 75) x (0.6 + 0.35 x 0.1) = 471.875 W; 16 GPUs + 2 chassis x 3700 W + 16 x 60 W network
    busy = cost.utilisation({"compute": 6.0, "exposed_dp": 1.0, "pipeline_bubble": 3.0}, 10.0)
    assert busy == pytest.approx({"compute": 0.6, "comm": 0.1})
    watts = 16 * 471.875 + 2 * 3700 + 16 * 60
    assert cost.power_W(dgx, 16, busy=busy) == pytest.approx(watts)        # 15,910 W
    out = cost.run_costs(1e6, dgx, 16, JobSpec(total_tokens=300e9), busy=busy)
    assert out["power_kW"] == pytest.approx(15.910)
    assert out["tokens_per_joule"] == pytest.approx(1e6 / (watts * 1.2))   # perf per W at the facility (PUE 1.2)
    assert out["energy_MWh"] == pytest.approx(watts * 1.2 * 300e9 / 1e6 / 3.6e9)
    # the floor: every GPU at its 75 W idle draw
    assert cost.power_floor_W(dgx, 16) == pytest.approx(16 * 75 + 2 * 3700 + 16 * 60)   # 9,560 W


def test_space_reads_power_objectives_and_cap(tiny_raw):
    tiny_raw["objectives"] = ["energy", "tokens_per_joule", {"mfu": "max"}]
    tiny_raw["constraints"] = {"max_power_kW": 80}
    space = parse_space(tiny_raw, TINY_SOURCE)
    assert [(o.metric, o.direction) for o in space.objectives] == [
        (Metric.ENERGY, Direction.MIN), (Metric.TOKENS_PER_JOULE, Direction.MAX), (Metric.MFU, Direction.MAX)]
    assert space.objectives[1].column == "tokens_per_joule"
    assert space.constraints.max_power_kW == 80
    tiny_raw["constraints"] = {"max_power_kW": -5}
    with pytest.raises(ConfigError, match=r"constraints\.max_power_kW.*must be > 0, got -5"):
        parse_space(tiny_raw, TINY_SOURCE)


def test_cap_below_the_idle_floor_prunes_before_replay(tiny_raw):
    # floors: 64 GPUs 64 x 75 + 8 x 3700 + 64 x 60 = 38.24 kW; 128 GPUs 76.48 kW. A 50 kW cap prunes every
    # 128-GPU point (half the grid) before any replay and none of the 64-GPU points.
    tiny_raw["constraints"] = {"max_power_kW": 50}
    space = parse_space(tiny_raw, TINY_SOURCE)
    ctx, fp = build_context(space, RunOptions())
    factory = CandidateFactory(space, ctx, fp)
    cands = list(grid(space, factory))
    assert factory.stats.by_category["constraint max_power_kW"] == grid_size(space) // 2
    assert "power at least 76.5 kW" in factory.stats.examples["constraint max_power_kW"]
    assert cands and all(c.parallel.gpus == 64 for c in cands)


def test_cap_on_replayed_power_is_a_budget(tiny_raw):
    space = parse_space(dict(tiny_raw, constraints={"max_power_kW": 80}), TINY_SOURCE)
    df = pd.DataFrame([{"status": "ok", "power_kW": 72.0}, {"status": "ok", "power_kW": 100.0},
                       {"status": "infeasible", "power_kW": 10.0}])
    assert meets_constraints(df, space).tolist() == [True, False, False]
    assert constraint_violation({"status": "ok", "power_kW": 100.0}, space) == pytest.approx(0.25)   # 100/80 - 1
    assert constraint_violation({"status": "ok", "power_kW": 72.0}, space) == 0.0


def test_search_under_a_power_cap_end_to_end(tmp_path, write_space, tiny_raw):
    """The real replay: 128-GPU designs average ~140 kW at their utilisation (their idle floor, 76.5 kW, is
    under the cap, so they are replayed), and an 80 kW cap keeps only 64-GPU designs on the front."""
    tiny_raw.update(objectives=["energy", "tokens_per_joule"], constraints={"max_power_kW": 80})
    out = tmp_path / "out"
    assert main(["search", str(write_space(tiny_raw)), "--executor", "serial", "--out", str(out)]) == 0
    df = pd.read_parquet(out / "candidates.parquet")
    ok = df[df["status"] == "ok"]
    assert (ok.loc[ok["gpus"] == 128, "power_kW"] > 80).all() and (ok["gpus"] == 128).any()
    front = pd.read_csv(out / "pareto.csv")
    assert len(front) and (front["power_kW"] <= 80).all() and (front["gpus"] == 64).all()
    # perf per W is the replay's: tokens/s over facility power
    assert ok["tokens_per_joule"].to_numpy() == pytest.approx(
        (ok["tokens_per_s"] / (ok["power_kW"] * 1000 * 1.2)).to_numpy())
    summary = (out / "summary.md").read_text()
    assert "power cap: average IT power at the candidate's utilisation <= 80.0 kW" in summary
    assert "75 W idle in pipeline bubbles" in summary and "tokens per joule = tokens/s / (power x PUE)" in summary
    n_over = int((ok["power_kW"] > 80).sum())
    assert f"{n_over} ok designs exceed the constraint on power_kW (max 80" in summary


def test_nsga2_optimises_energy_and_tokens_per_joule_under_a_cap(tiny_raw, tmp_path):
    tiny_raw.update(method="optuna-nsga2", budget={"trials": 12}, batch=4,
                    objectives=[{"energy": "min"}, {"tokens_per_joule": "max"}], constraints={"max_power_kW": 60})
    space = parse_space(tiny_raw, TINY_SOURCE)
    run_study(space, RunOptions(out=tmp_path, executor="serial", evaluate_fn=fakes.fake_evaluate,
                                precheck_fn=fakes.fake_precheck, chunk_size=4, timelines=False))
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert study.metric_names == ["energy", "tokens_per_joule"]
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MAXIMIZE]
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done
    df = pd.read_parquet(tmp_path / "candidates.parquet").set_index("key")
    for t in done:
        row = df.loc[t.user_attrs["key"]]
        assert t.values == pytest.approx([row["energy_MWh"], row["tokens_per_joule"]])
        assert t.constraints["violation"] == pytest.approx(max(0.0, row["power_kW"] / 60 - 1))
