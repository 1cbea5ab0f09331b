"""`comet search SPACE.yaml`: run a study (grid / random / Optuna) over parallelism x cluster provisioning,
with a progress bar, and print the Pareto set and where the results are."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table

from comet.cli.argtypes import non_negative_int, positive_int
from comet.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser("search", help="search parallelism x cluster configurations (docs/search-space.md)",
                              description=__doc__)
    p.add_argument("space", help="search-space YAML, e.g. search_spaces/gpt3_1t.yaml")
    p.add_argument("--executor", choices=("ray", "serial"), default="ray",
                   help="ray (default: starts a local Ray, or joins --address) or serial (debugging)")
    p.add_argument("--address", help="join an existing Ray cluster (e.g. auto or 10.0.0.1:6379)")
    p.add_argument("--workers", type=positive_int, help="Ray worker processes (default: CPU count)")
    p.add_argument("--trials", type=positive_int, help="evaluate at most N candidates (overrides budget.trials)")
    p.add_argument("--seed", type=non_negative_int, help="overrides the space's seed")
    p.add_argument("--out", help="results folder (default: results/<study>)")
    p.add_argument("--chunk", type=positive_int, help="candidates per Ray task (default: sized to the work)")
    p.add_argument("--force", action="store_true", help="enumerate a grid larger than 1,000,000 points")
    p.add_argument("--no-timelines", action="store_true", help="skip the Chrome-trace timelines of the top designs")
    p.add_argument("--top", type=int, metavar="N",
                   help="print each objective's N best Pareto designs (default: the whole front)")
    p.set_defaults(func=run)


class _RichProgress:
    """The driver's Progress hooks drawn as a rich progress bar with rate and ETA."""

    def __init__(self, console: Console):
        self.console = console
        self.bar = Progress(TextColumn("[bold]search"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                            TextColumn("{task.fields[rate]:>7} cand/s"), TextColumn("ok {task.fields[ok]}"),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                            transient=False)
        self.task = None
        self.ok = 0

    def placed(self, where):
        self.console.print(f"running on {where}", highlight=False)

    def start(self, total, resumed):
        if resumed:
            self.console.print(f"resuming: {resumed} candidates already in the journal are not evaluated again")
        self.bar.start()
        self.task = self.bar.add_task("search", total=total, rate="-", ok=0)

    def advance(self, row):
        self.ok += row.get("status") == "ok"
        self.bar.advance(self.task)
        task = self.bar.tasks[0]
        speed = task.speed
        self.bar.update(self.task, rate=f"{speed:.1f}" if speed else "-", ok=self.ok)

    def finish(self):
        if self.task is not None:
            self.bar.stop()


class _LineProgress:
    """Progress for a log or a pipe: a line at the start and at every 10% with rate and ETA."""

    def __init__(self, console: Console):
        self.console = console
        self.total, self.done, self.next_mark, self.t0 = None, 0, 0.1, 0.0

    def placed(self, where):
        self.console.print(f"running on {where}", highlight=False)

    def start(self, total, resumed):
        import time
        self.total, self.t0 = total, time.monotonic()
        if resumed:
            self.console.print(f"resuming: {resumed} candidates already in the journal are not evaluated again")
        self.console.print(f"search: {total if total is not None else 'up to the budget'} candidates to evaluate")

    def advance(self, row):
        import time
        self.done += 1
        if not self.total or self.done / self.total < self.next_mark:
            return
        self.next_mark += 0.1
        elapsed = time.monotonic() - self.t0
        rate = self.done / elapsed if elapsed > 0 else float("nan")
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        self.console.print(f"search: {self.done}/{self.total} ({self.done / self.total:.0%}) "
                           f"{rate:.1f} cand/s, ETA {eta:.0f} s")

    def finish(self):
        pass


def run(args: argparse.Namespace) -> int:
    from comet.search.driver import RunOptions, run_study
    from comet.search.space import grid_size, load_space

    for flag in ("workers", "trials", "chunk", "top"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(f"must be >= 1, got {value}", field=f"--{flag}")
    space = load_space(args.space)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)   # piped or logged: wide enough for the Pareto table
    progress = _RichProgress(console) if console.is_terminal else _LineProgress(console)
    opts = RunOptions(out=Path(args.out) if args.out else None, executor=args.executor, workers=args.workers,
                      address=args.address, trials=args.trials, seed=args.seed, chunk_size=args.chunk,
                      timelines=not args.no_timelines, progress=progress, force=args.force)
    size = grid_size(space)
    console.print(f"study [bold]{space.study}[/]: method {space.method.value}, executor {args.executor}"
                  + (f" ({args.workers} workers)" if args.workers else "")
                  + (f"; grid of {size:,} points before pruning" if size != float("inf") else ""))
    with _study_gc():
        outcome = run_study(space, opts)
        _print_outcome(console, outcome, space, args.top)
    # perf: the study is written and its files closed; at process exit the interpreter's last cyclic
    # collections would walk the whole heap (~0.4 s after a gpt3_1t study). Frozen objects are skipped by
    # them and still freed by reference counting; only garbage cycles are left to the OS.
    atexit.register(gc.freeze)
    return 130 if outcome.interrupted else 0


@contextlib.contextmanager
def _study_gc():
    """perf: a study allocates a few objects per candidate that live to the end (journal records, table
    rows, cache entries) and many that die at once; with CPython's default thresholds (700, 10, 10) the
    full collections walk every module, compiled kernel and record again and again (gpt3_1t: ~0.5 s of
    ~6). What is loaded before the study is frozen (not walked while it runs) and a collection runs every
    10,000 net allocations instead of 700; cyclic garbage is still collected. Restored afterwards (the
    CLI also runs inside other processes: tests, notebooks)."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _print_outcome(console: Console, outcome, space, top: int | None = None) -> None:
    if outcome.base_note:
        console.print(outcome.base_note)
    s = outcome.stats
    pruned = ", ".join(f"{k} {n}" for k, n in s.by_category.most_common()) or "none"
    console.print(f"proposed {s.proposed}, duplicates {s.duplicates}, pruned {s.pruned} ({pruned})")
    status = outcome.frame["status"].value_counts().to_dict() if not outcome.frame.empty else {}
    console.print(f"evaluated {outcome.evaluated_now} now + {outcome.resumed} resumed; results: "
                  + ", ".join(f"{k} {v}" for k, v in status.items()) + f"; {outcome.wall_s:.1f} s")
    if not outcome.front.empty:
        console.print(_front_table(outcome, space, top))
    if outcome.budget_stop:
        console.print("[yellow]wall-time budget reached[/]: candidates are left; run the same command again "
                      "to continue", highlight=False)
    if outcome.interrupted:
        console.print("[yellow]interrupted[/]: results so far were saved; run the same command again to resume",
                      highlight=False)
    console.print(f"results: {outcome.out_dir}/ (summary.md, candidates.parquet, pareto.csv, plots, timelines)")
    sys.stdout.flush()


def _front_table(outcome, space, top: int | None) -> Table:
    """The Pareto front (equivalent designs merged), or each objective's `top` best: a design column that
    wraps (cluster axes that vary, then the layout) and the objectives, so it fits an 80-column terminal."""
    from comet.search.analysis import cluster_columns
    from comet.search.front import merge_equivalent, sort_by, top_per_objective
    from comet.search.naming import cluster_name, parallel_name

    merged = outcome.merged if outcome.merged is not None else merge_equivalent(outcome.front, space)
    rows = top_per_objective(merged, space, top) if top else sort_by(merged, space.objectives[0], space.objectives)
    varying = [c for c in cluster_columns(outcome.frame) if c != "gpus"]
    what = f"each objective's best {top}" if top else "whole front"
    table = Table(title=f"Pareto set: {len(outcome.front)} designs, {len(merged)} distinct ({what})",
                  show_lines=True)
    table.add_column("design (cluster | layout)", ratio=1, overflow="fold", min_width=24)   # takes what is left
    objs = [o.column for o in space.objectives]
    room = (3 if top else 4) - len(objs)   # an 80-column terminal holds the design and four numbers
    cols = objs + [c for c in ("step_time_s", "mfu") if c not in objs][:max(0, room)]
    for c in cols:
        table.add_column(HEADERS.get(c, c), justify="right", no_wrap=True)
    if top:
        table.add_column("top for", overflow="fold", max_width=14)
    for _, r in rows.iterrows():
        name = f"{cluster_name(r, varying)} | {parallel_name(r)}"
        if r.get("equivalent"):
            name += f" (same at {r['equivalent']})"
        cells = [name] + [f"{r[c]:.1%}" if c == "mfu" else _money(r[c]) if c.endswith("_usd") else _cell(r[c])
                          for c in cols] \
            + ([r["best_for"].replace("_", " ")] if top else [])
        table.add_row(*cells)
    return table


HEADERS = {"time_to_train_days": "days", "cost_per_run_usd": "USD/run", "capex_usd": "capex USD",
           "energy_MWh": "MWh", "step_time_s": "step s", "mfu": "MFU", "gpus": "GPUs"}


def _money(v) -> str:
    """USD in a narrow cell: 2.73M, 223.9M, 950k."""
    if not isinstance(v, (int, float)) or v != v:
        return "-"
    return f"{v / 1e6:,.3g}M" if abs(v) >= 1e6 else f"{v / 1e3:,.3g}k" if abs(v) >= 1e3 else f"{v:.0f}"


def _cell(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    return str(v)
