"""Optuna through ask/tell: trials are asked in fixed-size rounds, evaluated by any executor, and told
in ask order, so a study gives the same trials with the serial and the Ray executor. Infeasibility
(a broken rule, no memory fit, a blown budget) is told as a constraint (`trial.set_constraint`, which
Optuna 5's TPE and NSGA-II samplers read in place of the deprecated constraints_func), never as a
failed trial. Stored in results/<study>/optuna.db.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from comet.search.candidates import CandidateFactory, Pruned
from comet.search.context import Candidate
from comet.search.space import Axis, Direction, Method, SearchSpace

# Placeholder objective values told for infeasible trials (Optuna needs finite values; the
# constraint, not the value, ranks them behind every feasible trial).
_WORST = 1e30


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


class OptunaProposer:
    """Asks candidates from an Optuna study and tells it their results."""

    def __init__(self, space: SearchSpace, factory: CandidateFactory, storage_path: Path, seed: int):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space, self.factory = space, factory
        directions = ["minimize" if o.direction is Direction.MIN else "maximize" for o in space.objectives]
        self.study = optuna.create_study(study_name=space.study, storage=f"sqlite:///{storage_path}",
                                         directions=directions, sampler=make_sampler(space.method, seed),
                                         load_if_exists=True)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.study.tell(t.number, state=TrialState.FAIL)   # asked by an interrupted run, never told

    @property
    def evaluated_before(self) -> int:
        """Completed trials that passed pruning (the trial budget counts these)."""
        return sum(1 for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   if not t.user_attrs.get("pruned"))

    def ask(self) -> tuple[optuna.Trial, Candidate | Pruned]:
        trial = self.study.ask()
        values = {a.name: suggest(trial, a) for a in self.space.axes}
        out = self.factory.make(values, trial.number)
        if isinstance(out, Candidate):
            trial.set_user_attr("key", out.key)
        return trial, out

    def tell(self, trial: optuna.Trial, row: dict | None, violation: float, reason: str = "") -> None:
        """Tell a finished trial; `row` is the flat result row (None for a pruned candidate)."""
        trial.set_constraint("violation", violation)   # <= 0 feasible, > 0 infeasible (Optuna's convention)
        if row is None:
            trial.set_user_attr("pruned", True)
        if reason:
            trial.set_user_attr("reason", reason[:500])
        values = []
        for obj in self.space.objectives:
            v = None if row is None else row.get(obj.column)
            ok = v is not None and math.isfinite(v)
            if not ok:
                v = _WORST if obj.direction is Direction.MIN else -_WORST
            values.append(float(v))
        self.study.tell(trial, values)
