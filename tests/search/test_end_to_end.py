"""End to end with the real comet.evaluate: the CLI on the tiny space (serial), serial vs Ray give
identical results, and a crashing worker is retried once then recorded as an error. Ray starts once
for the module (it costs seconds on a 2-core machine)."""

from __future__ import annotations

import gzip
import os
import shutil

import pandas as pd
import pytest

import search_fakes as fakes
from comet.cli import main
from comet.search.context import EvalContext
from comet.search.driver import RunOptions, run_study
from comet.search.space import load_space, parse_space

from search_fakes import TINY

COLUMNS = ["key", "label", "status", "reason", "gpus", "step_time_s", "mfu", "memory_gb_per_gpu",
           "breakdown.compute", "breakdown.exposed_dp", "time_to_train_days", "cost_per_run_usd", "capex_usd"]


def _table(df: pd.DataFrame) -> pd.DataFrame:
    return df[COLUMNS].sort_values("key").reset_index(drop=True)


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.cloudpickle.register_pickle_by_value(fakes)   # the crash test ships the fake to workers
    from comet.search import ray_runtime
    _, cleanup = ray_runtime.start_local(ray, 2)   # private: never joins a `ray start` cluster on the machine
    yield ray
    ray.shutdown()
    cleanup()


def test_cli_tiny_serial(tmp_path, capsys):
    code = main(["search", str(TINY), "--executor", "serial", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert f"results: {tmp_path}" in out and "Pareto set" in out
    df = pd.read_parquet(tmp_path / "candidates.parquet")
    assert len(df) > 0 and (df["status"] == "ok").any()
    ok = df[df["status"] == "ok"]
    # the breakdown adds up to the step time, and the cost columns come from comet.cost
    parts = ok[[c for c in ok.columns if c.startswith("breakdown.")]].sum(axis=1)
    assert (abs(parts - ok["step_time_s"]) <= 1e-6 * ok["step_time_s"]).all()
    assert (ok["time_to_train_days"] * 86400 * ok["tokens_per_s"]).round(-6).eq(300e9).all()
    summary = (tmp_path / "summary.md").read_text()
    assert "pruned because" in summary and "Case-study questions" in summary


def test_serial_and_ray_identical(ray_session, tmp_path):
    space = load_space(TINY)
    serial = run_study(space, RunOptions(out=tmp_path / "serial", executor="serial", timelines=False))
    remote = run_study(space, RunOptions(out=tmp_path / "ray", executor="ray", workers=2, chunk_size=3,
                                         timelines=False))
    assert remote.evaluated_now == serial.evaluated_now > 0
    pd.testing.assert_frame_equal(_table(serial.frame), _table(remote.frame))
    pd.testing.assert_frame_equal(serial.front[COLUMNS].reset_index(drop=True),
                                  remote.front[COLUMNS].reset_index(drop=True))


def test_ray_workers_draw_the_same_plots_and_timelines(ray_session, tmp_path):
    """On Ray the plots and timelines are drawn by the workers (executor.side): the same bytes as the
    serial executor draws in place."""
    space = load_space(TINY)
    run_study(space, RunOptions(out=tmp_path / "serial", executor="serial"))
    run_study(space, RunOptions(out=tmp_path / "ray", executor="ray", workers=2, chunk_size=3))
    drawn = [p.relative_to(tmp_path / "serial") for p in (tmp_path / "serial").rglob("*")
             if p.suffix == ".png" or p.name.endswith(".json.gz")]
    assert len(drawn) >= 4 and any(p.parent.name == "timelines" for p in drawn)
    for rel in drawn:
        assert (tmp_path / "ray" / rel).read_bytes() == (tmp_path / "serial" / rel).read_bytes(), rel


def test_side_task_whose_worker_dies_runs_in_the_driver(ray_session):
    """A plot or timeline task that kills its worker is drawn by the driver instead, as the serial
    executor would: the study's outputs do not depend on a worker surviving."""
    from comet.search.executor import RayExecutor
    executor = RayExecutor(EvalContext(model=None, cluster=None, job=None), workers=2)
    try:
        pending = executor.side(fakes.dies_outside, os.getpid(), executor.share({"drawn": 1}))
        assert pending() == {"drawn": 1}
    finally:
        executor.close()


@pytest.fixture
def crash_tp4():
    fakes.CRASH_FILE.write_text("tp4-pp4-dp4-")       # workers evaluating these 4 candidates die (os._exit)
    yield
    fakes.CRASH_FILE.unlink(missing_ok=True)


def test_crashed_worker_retried_once_then_error(ray_session, crash_tp4, tiny_raw, tmp_path):
    space = parse_space(tiny_raw, str(TINY))
    out = run_study(space, RunOptions(out=tmp_path, executor="ray", workers=2, chunk_size=4, timelines=False,
                                      evaluate_fn=fakes.fake_evaluate, precheck_fn=fakes.fake_precheck))
    df = out.frame
    assert len(df) == 32                              # the study went on
    errors = df[df["status"] == "error"]
    assert len(errors) == 4 and errors["label"].str.startswith("tp4-pp4-dp4-").all()
    assert errors["reason"].str.startswith("worker crashed twice").all()
    # chunk-mates of a crashing candidate were retried alone and succeeded
    assert (df.loc[df["status"] != "error", "attempts"] == 2).any()
    assert (errors["attempts"] == 2).all()           # one retry, then recorded as an error


def test_resumed_study_writes_the_same_timelines(tmp_path):
    """Every candidate taken from the journal (JSON: lists where the configuration holds tuples): the
    timelines are evaluated from those records and come out as in the first run."""
    space = load_space(TINY)
    first = run_study(space, RunOptions(out=tmp_path, executor="serial"))
    written = {p.name: gzip.decompress(p.read_bytes()) for p in (tmp_path / "timelines").iterdir()}
    assert written and first.evaluated_now > 0
    shutil.rmtree(tmp_path / "timelines")
    again = run_study(space, RunOptions(out=tmp_path, executor="serial"))
    assert again.evaluated_now == 0 and again.resumed == first.evaluated_now
    assert {p.name: gzip.decompress(p.read_bytes()) for p in (tmp_path / "timelines").iterdir()} == written
