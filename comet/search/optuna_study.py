"""Optuna through ask/tell: trials are asked in fixed-size rounds, evaluated by any executor, and told
in ask order, so a study gives the same trials with the serial and the Ray executor. Infeasibility
(a broken rule, no memory fit, a blown budget) is told as a constraint (`trial.set_constraint`, which
Optuna 5's TPE and NSGA-II samplers read in place of the deprecated constraints_func), never as a
failed trial. Stored in results/<study>/optuna.db.

What optuna-dashboard shows: objectives named (`set_metric_names`: time_to_train, cost_per_run, ...); a
design with results that breaks a budget constraint is COMPLETE with its real values and a violation
> 0; a design without results (a broken rule, no memory fit, an infeasible replay) is PRUNED with its
violation and `reason`, never a placeholder value; a design proposed again is told the known result
with `duplicate_of` and does not count against the trial budget (`counted` marks the trials that do).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from comet.search.candidates import CandidateFactory, Pruned
from comet.search.context import Candidate
from comet.search.space import Axis, Direction, Method, SearchSpace

def make_sampler(method: Method, seed: int) -> optuna.samplers.BaseSampler:
    if method is Method.OPTUNA_NSGA2:
        return optuna.samplers.NSGAIISampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True)


def suggest(trial: optuna.Trial, axis: Axis) -> Any:
    if axis.is_grid:
        if len(axis.values) == 1:
            return axis.values[0]
        return trial.suggest_categorical(axis.name, list(axis.values))
    r = axis.range
    if r.integer:
        return trial.suggest_int(axis.name, int(r.low), int(r.high), log=r.log, step=int(r.step or 1))
    return trial.suggest_float(axis.name, r.low, r.high, log=r.log, step=r.step)


TOLD = (TrialState.COMPLETE, TrialState.PRUNED)


class OptunaProposer:
    """Asks candidates from an Optuna study and tells it their results.

    Resumable: the sampler is re-seeded before each ask from (seed, trial number), and every trial
    records its round; a run killed mid-round leaves RUNNING trials that the next run completes (asking
    the rest of the round first), so a killed and resumed study asks the same trials as an uninterrupted
    one. (A kill inside one `ask` itself, a window of microseconds, can still change that one trial.)
    """

    def __init__(self, space: SearchSpace, factory: CandidateFactory, storage_path: Path, seed: int):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space, self.factory, self.seed = space, factory, seed
        directions = ["minimize" if o.direction is Direction.MIN else "maximize" for o in space.objectives]
        self.study = optuna.create_study(study_name=space.study, storage=f"sqlite:///{storage_path}",
                                         directions=directions, sampler=make_sampler(space.method, seed),
                                         load_if_exists=True)
        with warnings.catch_warnings():   # experimental since Optuna 3.2, unchanged through 5.0
            warnings.simplefilter("ignore")
            self.study.set_metric_names([o.metric.value for o in space.objectives])

    @property
    def evaluated_before(self) -> int:
        """Trials told by earlier runs that count toward the trial budget (new evaluations, not duplicates)."""
        return sum(1 for t in self.study.get_trials(deepcopy=False, states=TOLD) if t.user_attrs.get("counted"))

    @property
    def asked_before(self) -> int:
        return len(self.study.get_trials(deepcopy=False))

    @property
    def next_round(self) -> int:
        return 1 + max((t.user_attrs.get("round", -1) for t in self.study.get_trials(deepcopy=False)), default=-1)

    def _reseed(self, number: int) -> None:
        # a fresh sampler seeded by the trial number: the trial asked depends only on the stored history
        # and its number, never on how many asks this process made before (what a resume changes)
        self.study.sampler = make_sampler(self.space.method, (self.seed * 1_000_003 + number) % 2**32)

    def ask(self, round_index: int, round_size: int) -> tuple[optuna.Trial, Candidate | Pruned]:
        self._reseed(self.asked_before)
        trial = self.study.ask()
        trial.set_user_attr("round", round_index)
        trial.set_user_attr("round_size", round_size)
        return self._propose(trial)

    def _propose(self, trial: optuna.Trial) -> tuple[optuna.Trial, Candidate | Pruned]:
        self._reseed(trial.number)
        values = {a.name: suggest(trial, a) for a in self.space.axes}   # stored params are returned as stored
        out = self.factory.make(values, trial.number)
        if isinstance(out, Candidate):
            trial.set_user_attr("key", out.key)
        return trial, out

    def open_round(self) -> tuple[int, int, list, int] | None:
        """The round a killed run left open: (index, size, [(trial, candidate)] asked in ask order,
        trials of it already told that count toward the budget), or None."""
        trials = self.study.get_trials(deepcopy=False)
        running = [t for t in trials if t.state == TrialState.RUNNING]
        if not running:
            return None
        index = max(t.user_attrs.get("round", -1) for t in trials)
        members = sorted((t for t in trials if t.user_attrs.get("round", index) == index
                          and t.state in (TrialState.RUNNING, *TOLD)), key=lambda t: t.number)
        size = max((t.user_attrs.get("round_size", 0) for t in members), default=0) or len(members)
        asked = [self._propose(optuna.trial.Trial(self.study, t._trial_id)) if t.state == TrialState.RUNNING
                 else (t, None) for t in members]
        told = sum(1 for t in members if t.state in TOLD and t.user_attrs.get("counted"))
        return index, size, asked, told

    def tell(self, trial: optuna.Trial, row: dict | None, violation: float, reason: str = "", *,
             counted: bool = False, duplicate_of: str | None = None) -> None:
        """Tell a finished trial; `row` is the flat result row (None for a design without results)."""
        trial.set_constraint("violation", violation)   # <= 0 feasible, > 0 infeasible (Optuna's convention)
        if row is None:
            trial.set_user_attr("pruned", True)
        if reason:
            trial.set_user_attr("reason", reason[:500])
        if counted:
            trial.set_user_attr("counted", True)
        if duplicate_of:
            trial.set_user_attr("duplicate_of", duplicate_of)
        values = [None if row is None else row.get(o.column) for o in self.space.objectives]
        if all(v is not None and math.isfinite(v) for v in values):
            self.study.tell(trial, [float(v) for v in values])
        else:   # no objective values: PRUNED, with the reason and the constraint, no placeholder values
            self.study.tell(trial, state=TrialState.PRUNED)
