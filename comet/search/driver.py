"""Run a study: propose candidates, evaluate them on an executor, write each result to the journal as
it arrives, and turn the journal into tables, plots, timelines and summary.md at the end (also after
Ctrl-C). Re-running the same command resumes: candidates already in the journal are not evaluated again.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from comet.config.cluster import CostSpec, load_cluster
from comet.config.loader import from_dict
from comet.config.model import load_model
from comet.config.paths import check_output_dir
from comet.errors import ConfigError, TraceError
from comet.search import artifacts
from comet.search import results as res_io
from comet.search.candidates import CandidateFactory, PruneStats, Pruned, grid, random_candidates
from comet.search.context import (Candidate, EvalContext, cluster_axes, context_fingerprint, engine_fingerprint,
                                  parallel_dict, parallel_from_params)
from comet.search.executor import make_executor
from comet.search.front import merge_equivalent
from comet.search.lock import ResultsLock
from comet.search.records import Finished, flatten
from comet.search.space import PARALLEL_AXES, Method, SearchSpace, grid_size

# The grid is enumerated (and pruned) in memory before evaluation, so memory and the wait before the
# first evaluation grow linearly with its points; 10^6 is ~70x the 14,400-point space `make kill-check`
# searches in about a minute. Larger grids need --force.
MAX_GRID_POINTS = 1_000_000


class Progress:
    """Hooks the CLI implements (with rich); the driver itself prints nothing."""

    def placed(self, where: str) -> None: ...          # where the candidates are evaluated
    def start(self, total: int | None, resumed: int) -> None: ...
    def advance(self, row: dict) -> None: ...
    def finish(self) -> None: ...


@dataclass
class RunOptions:
    out: Path | None = None           # default results/<study>
    executor: str = "ray"             # ray | serial
    workers: int | None = None
    address: str | None = None
    trials: int | None = None         # overrides budget.trials
    seed: int | None = None           # overrides the space's seed
    chunk_size: int | None = None     # candidates per task (default: sized to the work)
    timelines: bool = True
    progress: Progress = field(default_factory=Progress)
    evaluate_fn: Callable | None = None   # tests only: a fake evaluate for driver mechanics
    precheck_fn: Callable | None = None
    force: bool = False               # enumerate a grid above MAX_GRID_POINTS


@dataclass
class StudyOutcome:
    out_dir: Path
    frame: pd.DataFrame
    front: pd.DataFrame
    stats: PruneStats
    evaluated_now: int
    resumed: int
    errors: int
    interrupted: bool
    wall_s: float
    budget_stop: bool
    files: list[Path]
    base_note: str = ""          # how the base was grounded (e.g. per-class factors from a profiler trace)
    where: str = ""              # where it ran: private local Ray, a cluster address, or this process
    phases: dict = field(default_factory=dict)   # wall seconds: start-up, evaluation, writing (before summary.md)
    merged: pd.DataFrame | None = None   # the front with equivalent designs merged (summary.md and the CLI table)


# ----------------------------------------------------------------------------- context

def build_context(space: SearchSpace, opts: RunOptions) -> tuple[EvalContext, str]:
    try:
        model = load_model(space.model)
    except ConfigError as exc:
        raise ConfigError(str(exc), source=space.source) if exc.source is None else exc from None
    if not Path(space.cluster_spec).is_file():
        raise ConfigError(f"cluster spec not found: {space.cluster_spec} (relative paths are looked up next to "
                          "the space file, then in the working folder)", source=space.source, field="cluster.spec")
    cluster = load_cluster(space.cluster_spec)
    if space.cost:
        merged = {**dataclasses.asdict(cluster.cost), **space.cost}
        cluster = replace(cluster, cost=from_dict(CostSpec, merged, source=space.source, path="cluster.cost"))
    base = build_base(space, model)
    ctx = EvalContext(model=model, cluster=cluster, job=space.job, base=base,
                      evaluate_fn=opts.evaluate_fn, precheck_fn=opts.precheck_fn)
    fingerprint = context_fingerprint({"model": dataclasses.asdict(model), "cluster": dataclasses.asdict(cluster),
                                       "job": dataclasses.asdict(space.job), "base": dataclasses.asdict(space.base),
                                       "global_batch": space.global_batch, "engine": engine_fingerprint(),
                                       # a replaced trace at the same path changes the factors: not resumed
                                       "calibration": _calibration(base).factors if _calibration(base) else None})
    return replace(ctx, fingerprint=fingerprint), fingerprint


def _calibration(base):
    return getattr(base, "meta", {}).get("calibration") if base is not None else None


def build_base(space: SearchSpace, model) -> Any:
    """The study's base StepGraph: built for the reference configuration, or built for the configuration a
    profiler trace was measured with and calibrated to it per kernel class (comet/trace/calibrate_base.py;
    its report is kept in meta['calibration'] for the caller to print)."""
    if space.base.trace is not None:
        return _calibrated_base(space, model)
    if space.base.build is None:
        return None
    try:
        from comet.transform import transform_to  # noqa: F401 - evaluate() rescales the base graph with it
    except ImportError:
        return None   # transformations not available yet: evaluate() builds each candidate's graph
    from comet.workload.builder import build_step_graph
    return build_step_graph(model, _reference_parallel(space, model))


def _reference_parallel(space: SearchSpace, model):
    """The resolved ParallelConfig of `base.build`."""
    params = dict(space.base.build)
    gpus_axis = next((a for a in space.provision if a.short == "gpus" and a.is_grid), None)
    gpus = params.pop("gpus", None) or (None if params.get("dp") else gpus_axis.values[0] if gpus_axis else None)
    canon = {k: PARALLEL_AXES[k](v, f"base.build.{k}") for k, v in params.items()}
    try:
        return parallel_from_params(canon, space.global_batch, gpus).resolve(model)
    except ConfigError as exc:
        raise ConfigError(f"the reference configuration breaks a rule: {exc}", source=space.source,
                          field="base.build") from None


def _calibrated_base(space: SearchSpace, model) -> Any:
    """base.trace: import the trace, build + materialize the base on base.cluster (default: the study's
    cluster spec) and scale its kernel classes to the measured times."""
    from comet.trace import load_trace
    from comet.trace.calibrate_base import calibrate_base
    spec = space.base.cluster or space.cluster_spec
    if not Path(spec).is_file():
        raise ConfigError(f"cluster spec not found: {spec}", source=space.source, field="base.cluster")
    from comet.trace.ground import ground_for     # an LLM step it recognises: grounded op by op
    try:
        base, report = ground_for(space.base.trace, model, load_cluster(spec))
        return base.with_(meta=dict(base.meta, calibration=report))
    except (TraceError, ConfigError) as exc:
        if not space.base.build:
            raise TraceError(f"{space.source}: base.trace: {exc}; give base.build (the configuration it ran) "
                             "to calibrate per kernel class instead") from None
    par = _reference_parallel(space, model)
    try:
        trace = load_trace(space.base.trace)
    except TraceError as exc:
        raise TraceError(f"{space.source}: base.trace: {exc}") from None
    try:
        base, report = calibrate_base(trace, model, par, load_cluster(spec),
                                      where=f"base.trace ({space.base.trace})")
    except ConfigError as exc:
        raise ConfigError(str(exc), source=space.source) from None
    return base.with_(meta=dict(base.meta, calibration=report))


# ----------------------------------------------------------------------------- the run

class _State:
    """Finished results of this study (journal + this run), written as they arrive."""

    def __init__(self, journal: res_io.Journal, fingerprint: str, progress: Progress):
        self.journal, self.fingerprint, self.progress = journal, fingerprint, progress
        # key -> journal record (dict) read from the journal, or this run's records.Finished
        self.done: dict[str, dict | Finished] = {
            k: r for k, r in journal.load().items() if r.get("fp") == fingerprint}
        self.from_journal = frozenset(self.done)
        self.scope: set[str] | None = None     # keys of this space's candidates (None: every record)
        self.budget_stop = False                # stopped by the wall-time budget with candidates left
        self.evaluated_now = 0
        self.resumed = 0
        self.rows: dict[str, dict] = {}
        self.where = ""                           # where the candidates are evaluated
        self.t_start = self.t_end = None    # monotonic: evaluation began (executor up, candidates listed), ended

    def record(self, finished: list[Finished]) -> None:
        """Journal a finished chunk in one write, then report each."""
        for done in finished:
            self.journal.append_line(done.key, done.line)
            self.done[done.key] = done
            self.rows[done.key] = done.row
        self.journal.flush()
        for done in finished:
            self.evaluated_now += 1
            self.progress.advance(done.row)

    def placed(self, executor) -> None:
        """Once the candidates are listed: where they run (waits for a Ray still starting)."""
        self.where = executor.where
        self.progress.placed(self.where)

    def record_of(self, key: str) -> dict:
        done = self.done[key]
        return done.record() if isinstance(done, Finished) else done

    def row(self, key: str) -> dict:
        if key not in self.rows:
            self.rows[key] = flatten(self.done[key])
        return self.rows[key]


def run_study(space: SearchSpace, opts: RunOptions | None = None) -> StudyOutcome:
    opts = opts or RunOptions()
    t0 = time.monotonic()
    seed = space.seed if opts.seed is None else opts.seed
    trials = opts.trials or space.budget.trials
    out = Path(opts.out) if opts.out else Path("results") / space.study
    check_grid_size(space, opts.force)
    check_output_dir(str(out), "--out")             # a folder that cannot be written fails before any work
    ctx, fingerprint = build_context(space, opts)   # bad inputs fail here, before anything is written
    out.mkdir(parents=True, exist_ok=True)
    with ResultsLock(out):                          # a second search on this folder refuses (comet/search/lock.py)
        return _run_locked(space, opts, ctx, fingerprint, out, seed, trials, t0)


def check_grid_size(space: SearchSpace, force: bool) -> None:
    """A grid larger than MAX_GRID_POINTS is refused before anything is enumerated, unless forced."""
    size = grid_size(space)
    if space.method is Method.GRID and size > MAX_GRID_POINTS and not force:
        axes = " x ".join(f"{a.short} {len(a.values)}" for a in space.axes if len(a.values) > 1)
        raise ConfigError(f"the grid has {size:,} points ({axes}), more than {MAX_GRID_POINTS:,}: narrow the "
                          "axes, use method random or optuna-tpe with a trial budget, or pass --force",
                          source=space.source, field="method")


def _run_locked(space, opts, ctx, fingerprint, out: Path, seed, trials, t0) -> StudyOutcome:
    factory = CandidateFactory(space, ctx, fingerprint)
    state = _State(res_io.Journal(out / res_io.JOURNAL), fingerprint, opts.progress)
    deadline = t0 + space.budget.wall_time_s if space.budget.wall_time_s else None
    executor = None
    interrupted = evaluated = False
    try:
        executor = make_executor(opts.executor, ctx, opts.workers, opts.address)   # Ray: starts in the background
        if space.method.uses_optuna:
            _run_optuna(space, factory, state, executor, out, seed, trials, deadline, opts)
        else:
            _run_stream(space, factory, state, executor, seed, trials, deadline, opts)
        evaluated = True
    except KeyboardInterrupt:
        interrupted = True
        if executor is not None:
            executor.cancel()
    finally:
        state.t_end = time.monotonic()
        state.journal.compact()
        if executor is not None and not evaluated:
            executor.close(wait=False)            # Ray shuts down while the tables are written
        opts.progress.finish()
    try:
        return _finish(space, ctx, state, factory.stats, out, seed, trials, fingerprint, interrupted, t0, opts,
                       state.where, executor)
    finally:
        if executor is not None:
            executor.close(wait=False)            # done already unless _finish raised
            executor.join()


def _chunk_size(opts: RunOptions, executor, remaining: int | None) -> int:
    if opts.chunk_size:
        return opts.chunk_size
    if executor.name == "serial" or not remaining:
        return 32      # the journal is written once per chunk: a kill -9 loses at most this many results
    # perf: a Ray task costs milliseconds of scheduling and transfer: chunks of up to 256 candidates
    # amortise it, and at least ~6 chunks per worker keep the tail balanced
    return max(1, min(256, remaining // (6 * getattr(executor, "workers", executor.capacity)) or 1))


def _run_stream(space, factory, state: _State, executor, seed, trials, deadline, opts) -> None:
    if space.method is Method.GRID:
        listed = list(grid(space, factory))   # pruning is cheap: do it all first, so the total is known
        listed = listed[:trials] if trials is not None else listed
        # evaluate in a seeded random order, so a study cut short by its wall-time budget (or Ctrl-C)
        # has sampled every cluster configuration; the tables are sorted back into grid order
        random.Random(seed).shuffle(listed)
        state.scope = {c.key for c in listed}
        done = len(state.scope & state.done.keys())
        total, cands = len(listed) - done, iter(listed)
        state.placed(executor)
        opts.progress.start(total, done)
        state.t_start = time.monotonic()
    else:
        state.scope = set()
        cands, total = random_candidates(space, factory, seed), trials
        state.placed(executor)
        opts.progress.start(total, 0)
        state.t_start = time.monotonic()
    size = _chunk_size(opts, executor, total)
    taken = 0          # candidates proposed so far that count toward the trial budget
    exhausted = prepared = False
    while True:
        while not exhausted and executor.in_flight < executor.capacity:
            if deadline is not None and time.monotonic() >= deadline:
                state.budget_stop = next(cands, None) is not None
                exhausted = True
                break
            chunk = []
            while len(chunk) < size and (trials is None or taken < trials):
                cand = next(cands, None)
                if cand is None:
                    exhausted = True
                    break
                taken += 1
                state.scope.add(cand.key)
                if cand.key in state.done:
                    state.resumed += 1
                    continue
                chunk.append(cand)
            if not chunk:
                exhausted = exhausted or (trials is not None and taken >= trials)
                break
            executor.submit(chunk)
        if exhausted and not prepared:
            executor.prepare(artifacts.prepare)   # Ray: workers load the plotting code as they run out of chunks
            prepared = True
        if executor.in_flight == 0:
            return
        state.record(executor.wait())


def _run_optuna(space, factory, state: _State, executor, out: Path, seed, trials, deadline, opts) -> None:
    from comet.search.optuna_study import OptunaProposer

    proposer = OptunaProposer(space, factory, out / "optuna.db", seed)
    trials = trials or 10**9
    opened = proposer.open_round()              # a round a killed run left open is completed first
    counted = proposer.evaluated_before - (opened[3] if opened else 0)
    state.placed(executor)
    opts.progress.start(trials if trials < 10**9 else None, proposer.evaluated_before)
    state.t_start = time.monotonic()
    asks = proposer.asked_before
    while counted < trials and asks < 20 * trials + 100:
        if opened is not None:
            index, size, asked, _ = opened
            opened = None
            fresh = [proposer.ask(index, size) for _ in range(size - len(asked))]
            asked = asked + fresh
        else:
            if deadline is not None and time.monotonic() >= deadline:
                state.budget_stop = True
                break
            size, index = min(space.batch, trials - counted), proposer.next_round
            fresh = asked = [proposer.ask(index, size) for _ in range(size)]
        asks += len(fresh)
        todo: dict[str, Candidate] = {}
        for _, out_ in asked:
            if not isinstance(out_, Candidate):
                continue
            if out_.key in state.done or out_.key in todo:   # proposed again: told the known result
                state.resumed += out_.key in state.from_journal
                factory.stats.duplicates += out_.key not in state.from_journal
            else:
                todo[out_.key] = out_
        pending = list(todo.values())
        size = max(1, len(pending) // max(1, executor.capacity))
        for i in range(0, len(pending), size):
            executor.submit(pending[i:i + size])
        while executor.in_flight:
            state.record(executor.wait())
        first_ask: set[str] = set()
        for trial, out_ in asked:   # tell in ask order: the same study whatever the executor
            if out_ is None:        # told by the killed run before it died
                counted += bool(trial.user_attrs.get("counted"))
            elif isinstance(out_, Pruned):
                proposer.tell(trial, None, 1.0, out_.reason)
            else:
                row = state.row(out_.key)
                new = out_.key in todo and out_.key not in first_ask   # a duplicate does not count
                first_ask.add(out_.key)
                proposer.tell(trial, row if row.get("status") == "ok" else None,
                              res_io.constraint_violation(row, space), row.get("reason", ""), counted=new,
                              duplicate_of=None if new else out_.key)
                counted += new


# ----------------------------------------------------------------------------- outputs

def candidate_from_record(rec: dict) -> Candidate:
    """The candidate a journal record was evaluated for. A record read back from the journal has JSON's
    lists where the configuration holds tuples (recompute_modules): they are tuples again, or the
    configuration would not hash and a resumed study's timelines would fail to evaluate."""
    par = {k: tuple(v) if isinstance(v, list) else v for k, v in rec["parallel"].items()
           if k not in ("global_batch", "gpus")}
    parallel = parallel_from_params(par, rec["parallel"]["global_batch"], rec["parallel"]["gpus"])
    return Candidate(key=rec["key"], parallel=parallel, provision=tuple(rec["provision"].items()),
                     number=rec["number"], params=tuple(rec.get("params", {}).items()))


def _finish(space, ctx, state: _State, stats, out: Path, seed, trials, fingerprint, interrupted, t0,
            opts, where: str = "", executor=None) -> StudyOutcome:
    from comet.search import summary

    rows = [state.row(k) for k in state.done if state.scope is None or k in state.scope]
    df = res_io.frame(rows, study_columns(space, ctx), cluster_axes(ctx.cluster))
    front = res_io.pareto_rows(df, space)
    drawn = []      # (folder, [(file name, bytes)] or a pending side task)
    if not interrupted and not df.empty:
        # perf: on Ray the plots and timelines are drawn by the workers (idle now) while the tables are
        # written here; the serial executor draws them in place
        shared = executor.share(df)
        drawn += [(out, executor.side(artifacts.plot_files, names, shared, front, space))
                  for names in artifacts.PLOT_TASKS]
        if opts.timelines:
            for name, key, meta in artifacts.timeline_designs(space, front, df, ctx.model.name, ctx.cluster.name):
                cand = candidate_from_record(state.record_of(key))
                drawn.append((out / "timelines", _named(name, executor.side(artifacts.timeline_file, cand, meta))))
    files = res_io.write_tables(df, front, out) if not df.empty else []
    files.append(res_io.write_study_yaml(space, out, {
        "cluster_spec": space.cluster_spec, "seed": seed, "trials": trials, "method": space.method.value,
        "executor": opts.executor, "workers": opts.workers, "ran_on": where, "fingerprint": fingerprint}))
    for folder, pending in drawn:
        for name, data in pending():
            folder.mkdir(parents=True, exist_ok=True)
            files.append(folder / name)
            files[-1].write_bytes(data)
    if executor is not None:
        executor.close(wait=False)            # Ray shuts down while summary.md is written
    wall_s = time.monotonic() - t0
    start = (state.t_start or state.t_end) - t0
    phases = {"start-up": start, "evaluation": state.t_end - t0 - start, "writing": wall_s - (state.t_end - t0)}
    errors = int((df["status"] == "error").sum()) if not df.empty else 0
    outcome = StudyOutcome(out_dir=out, frame=df, front=front, stats=stats, evaluated_now=state.evaluated_now,
                           resumed=state.resumed, errors=errors, interrupted=interrupted, wall_s=wall_s,
                           budget_stop=state.budget_stop, files=files,
                           base_note=_calibration(ctx.base).line() if _calibration(ctx.base) else "", where=where,
                           phases=phases, merged=merge_equivalent(front, space))
    files.append(summary.write_summary(outcome, space, ctx, out))
    return outcome


def study_columns(space: SearchSpace, ctx: EvalContext) -> dict:
    """Columns every candidate row carries: what was trained and on which cluster spec."""
    return {"study": space.study, "model": ctx.model.name, "seq_len": ctx.model.seq_len,
            "global_batch": space.global_batch, "total_tokens": ctx.job.total_tokens,
            "cluster": ctx.cluster.name, "gpu": ctx.cluster.gpu.name}


def _named(name: str, pending):
    """A pending single file as the pending list of files the writer takes (none if it gave no bytes)."""
    return lambda: [(name, data) for data in [pending()] if data is not None]


__all__ = ["Progress", "RunOptions", "StudyOutcome", "run_study", "candidate_from_record", "parallel_dict"]
