"""Interrupted and concurrent runs: an Optuna study resumed after an interruption asks the same trials
as an uninterrupted one; a second search on a locked results folder refuses; a grid too large is refused
before enumeration; a full disk is one line (exit 2) and leaves a journal the next run resumes."""

from __future__ import annotations

import errno

import optuna
import pytest

import search_fakes as fakes
from comet.cli import main
from comet.errors import ConfigError
from comet.search import results as res_io
from comet.search.driver import MAX_GRID_POINTS, RunOptions, check_grid_size, run_study
from comet.search.lock import ResultsLock
from comet.search.space import parse_space
from search_fakes import ROOT

TINY_SOURCE = str(ROOT / "search_spaces" / "tiny.yaml")


def _opts(out, **kw) -> RunOptions:
    return RunOptions(out=out, executor="serial", evaluate_fn=fakes.fake_evaluate, precheck_fn=fakes.fake_precheck,
                      timelines=False, **kw)


def _trial_sequence(folder) -> list[tuple]:
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{folder / 'optuna.db'}")
    return [(t.number, tuple(sorted(t.params.items())), t.state.name) for t in study.trials]


@pytest.mark.parametrize("method", ["optuna-tpe", "optuna-nsga2"])
def test_optuna_resumed_after_interrupt_asks_the_same_trials(tiny_raw, tmp_path, method):
    tiny_raw.update(method=method, budget={"trials": 20}, batch=4, seed=3)
    tiny_raw["parallel"].update(micro_batch={"low": 1, "high": 8}, tp={"choices": [2, 4, 8]})
    space = parse_space(tiny_raw, TINY_SOURCE)
    full = run_study(space, _opts(tmp_path / "full"))

    fakes.INTERRUPT_AFTER.update(n=9, count=0)        # Ctrl-C inside the third round
    cut = run_study(space, _opts(tmp_path / "cut"))
    assert cut.interrupted
    running = [s for *_, s in _trial_sequence(tmp_path / "cut") if s == "RUNNING"]
    assert running                                     # the open round is left for the resume
    fakes.INTERRUPT_AFTER.update(n=None, count=0)
    again = run_study(space, _opts(tmp_path / "cut"))
    assert not again.interrupted
    assert _trial_sequence(tmp_path / "cut") == _trial_sequence(tmp_path / "full")
    assert sorted(again.frame["key"]) == sorted(full.frame["key"])
    # the resume evaluated only what the interrupted run had not journaled
    assert again.evaluated_now + cut.evaluated_now == full.evaluated_now


def test_second_search_on_a_locked_folder_refuses(tiny_raw, tmp_path):
    space = parse_space(tiny_raw, TINY_SOURCE)
    tmp_path.mkdir(exist_ok=True)
    with ResultsLock(tmp_path):
        with pytest.raises(ConfigError, match="is in use by another search"):
            run_study(space, _opts(tmp_path))
    assert not (tmp_path / res_io.JOURNAL).exists()     # nothing was written by the refused run
    assert run_study(space, _opts(tmp_path)).evaluated_now == 32   # the lock is gone with its holder


def test_grid_too_large_is_refused_before_enumeration(tiny_raw):
    tiny_raw["parallel"]["micro_batch"] = list(range(1, 2001))
    tiny_raw["cluster"]["gpus"] = list(range(8, 8 * 1001, 8))
    space = parse_space(tiny_raw, TINY_SOURCE)
    with pytest.raises(ConfigError, match=r"the grid has 32,000,000 points .* more than 1,000,000"):
        check_grid_size(space, force=False)
    check_grid_size(space, force=True)                  # --force: the user takes the cost
    assert MAX_GRID_POINTS == 1_000_000


def test_full_disk_is_one_line_and_the_journal_resumes(tiny_raw, tmp_path, monkeypatch, capsys, write_space):
    path = write_space(tiny_raw)
    out = tmp_path / "out"
    real_append, calls = res_io.Journal.append_line, {"n": 0}

    def append_until_full(self, key, line):
        calls["n"] += 1
        if calls["n"] > 5:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real_append(self, key, line)

    monkeypatch.setattr(res_io.Journal, "append_line", append_until_full)
    argv = ["search", str(path), "--executor", "serial", "--no-timelines", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "run the same command again" in err[0]
    assert len(res_io.Journal(out / res_io.JOURNAL).load()) == 5
    monkeypatch.setattr(res_io.Journal, "append_line", real_append)
    assert main(argv) == 0
    assert "resuming: 5 candidates" in capsys.readouterr().out
