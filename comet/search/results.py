"""Study results on disk: an append-only JSONL journal written as results arrive (nothing is lost on
Ctrl-C or a crash), turned into candidates.parquet / .csv, pareto.csv and study.yaml at the end."""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import pandas as pd
import yaml

from comet.search.context import PROVISION_KEYS
from comet.search.pareto import pareto_mask
from comet.search.records import _json_default
from comet.search.space import Direction, SearchSpace

JOURNAL = "journal.jsonl"


class Journal:
    """One JSON line per evaluated candidate; a torn last line is ignored on load.

    `append` serializes a record and `flush` writes what was appended since in one write (the driver
    flushes after every finished chunk, so a kill -9 loses at most the chunk in hand, which the resume
    evaluates again). While a run is going the lines go to journal.jsonl; at its end (also after Ctrl-C)
    `compact` folds them into journal.jsonl.gz (written beside and renamed, so a kill leaves either file
    whole): a flagship study's journal is ~15 MB as text, ~2 MB compressed. Loading reads both."""

    def __init__(self, path: Path):
        self.path = path
        self.gz = path.with_name(path.name + ".gz")
        self._file = None
        self._pending: list[str] = []
        self._keys: set[str] = set()
        self._only_mine: bool | None = None   # the plain journal holds only this run's whole, distinct lines
        self._packing: gzip.GzipFile | None = None   # while _only_mine: those lines compressed as written
        self._packed = self.gz.with_name(self.gz.name + ".tmp")

    def load(self) -> dict[str, dict]:
        records: dict[str, dict] = {}
        for line in self._lines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue    # a line cut short by a kill: that candidate is simply evaluated again
            if isinstance(rec, dict) and "key" in rec:
                records[rec["key"]] = rec
        return records

    def _lines(self):
        if self.gz.exists():
            try:
                with gzip.open(self.gz, "rt") as f:
                    yield from f
            except (OSError, EOFError):   # a damaged archive: what was read is kept, the rest re-evaluated
                pass
        if self.path.exists():
            with self.path.open() as f:
                yield from f

    def append(self, record: dict) -> None:
        """Queue one record (written by the next flush)."""
        self.append_line(record["key"], json.dumps(record, default=_json_default, allow_nan=True) + "\n")

    def append_line(self, key: str, line: str) -> None:
        """Queue the JSON line of the record of `key`, newline included (records.finish made it)."""
        if key in self._keys:
            self._only_mine = False
        self._keys.add(key)
        self._pending.append(line)

    def flush(self) -> None:
        if not self._pending:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a")
            if self._only_mine is None:
                self._only_mine = self._file.tell() == 0 and not self.gz.exists()
            if self._file.tell() and not _ends_with_newline(self.path):
                self._file.write("\n")   # close a torn line left by an earlier kill
        text, self._pending = "".join(self._pending), []
        try:
            self._file.write(text)
            self._file.flush()
            if self._only_mine:
                self._pack(text)
        except OSError:
            self._only_mine = False      # a partial write (full disk): compact parses every line
            raise

    def _pack(self, text: str) -> None:
        """perf: this run's lines compressed as they are written (one gzip stream, beside the journal),
        so that compact() only renames it: on Ray the driver waits for the workers meanwhile, and the
        compression (~0.1 s for gpt3_1t) is off the end of the run."""
        if self._packing is None:
            # level 3: half the time of 6 (gpt3_1t: 14 MB of JSON, 2.0 MB instead of 1.5 MB)
            self._packing = gzip.GzipFile(filename="", mode="wb", fileobj=self._packed.open("wb"),
                                          compresslevel=3, mtime=0)
        self._packing.write(text.encode())

    def _stop_packing(self) -> bool:
        """Close the stream of _pack; True when it holds the whole journal (else it is removed)."""
        packing, self._packing = self._packing, None
        if packing is None:
            return False
        raw = packing.fileobj
        packing.close()          # the gzip trailer; the file object is ours to close
        raw.close()
        if self._only_mine:
            return True
        self._packed.unlink(missing_ok=True)
        return False

    def close(self) -> None:
        if self._file is not None or self._pending:
            try:
                self.flush()
            finally:
                if self._file is not None:
                    self._file.flush()
                    os.fsync(self._file.fileno())
                    self._file.close()
                    self._file = None

    def compact(self) -> None:
        """Fold journal.jsonl into journal.jsonl.gz (one line per candidate, the last record of a key wins)."""
        self.close()
        packed = self._stop_packing()
        if not self.path.exists():
            return
        if not packed:   # lines of an earlier run or a key written twice: the last record of each key
            data = "".join(json.dumps(rec, default=_json_default, allow_nan=True) + "\n"
                           for rec in self.load().values()).encode()
            self._packed.write_bytes(gzip.compress(data, compresslevel=3, mtime=0))
        os.replace(self._packed, self.gz)
        self.path.unlink()
        self._only_mine, self._keys = None, set()


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def frame(flat: list[dict], study: dict | None = None, cluster: dict | None = None) -> pd.DataFrame:
    """The candidates table of flattened rows (records.flatten: not modified here), in candidate order.
    `study` holds columns every row shares (model, job, cluster spec name) and `cluster` the base
    cluster's value of every provisioning axis (context.cluster_axes): an axis a row does not set comes
    from there, so each row names its complete cluster."""
    rows = [{**(study or {}), **r} for r in sorted(flat, key=lambda r: (r["number"], r["key"]))]
    if cluster:
        for r in rows:
            for k, v in cluster.items():
                if k not in r:
                    no_tier = k == "expansion_bandwidth_GBps" and not r.get("expansion_GB")
                    r[k] = None if no_tier else v
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    head = [c for c in (*(study or {}), "key", "number", "label", "status", "reason", "gpus", "attempts",
                        *PROVISION_KEYS) if c in df.columns]
    df = df[head + [c for c in df.columns if c not in head]]   # the cluster axes side by side
    df["sequence_parallel"] = df["sequence_parallel"].astype("boolean")
    return df


def budget_limits(space: SearchSpace) -> list[tuple[float, str]]:
    """(limit, results column) of every budget constraint the space sets; max_power_kW caps the average
    IT power at the candidate's utilisation (power_kW, comet/cost.py: run_costs)."""
    c = space.constraints
    pairs = ((c.max_cost_per_run_usd, "cost_per_run_usd"), (c.max_time_to_train_days, "time_to_train_days"),
             (c.max_capex_usd, "capex_usd"), (c.max_gpus, "gpus"), (c.max_power_kW, "power_kW"))
    return [(limit, col) for limit, col in pairs if limit is not None]


def meets_constraints(df: pd.DataFrame, space: SearchSpace) -> pd.Series:
    """Status ok and every budget constraint of the space met."""
    if df.empty:
        return pd.Series([], dtype=bool)
    ok = df["status"] == "ok"
    for limit, col in budget_limits(space):
        if col in df:
            ok &= df[col] <= limit
    return ok


def constraint_violation(row: dict, space: SearchSpace) -> float:
    """0 when feasible, else > 0 (Optuna's convention): 1 for a broken rule, relative excess for a budget."""
    if row.get("status") != "ok":
        return 1.0
    worst = 0.0
    for limit, col in budget_limits(space):
        value = row.get(col)
        if value is not None and not math.isnan(value) and value > limit:
            worst = max(worst, value / limit - 1.0)
    return worst


def pareto_rows(df: pd.DataFrame, space: SearchSpace) -> pd.DataFrame:
    """Feasible rows on the Pareto front of the space's objectives, best first objective first."""
    if df.empty:
        return df
    feasible = df[meets_constraints(df, space)]
    if feasible.empty:
        return feasible
    cols = [o.column for o in space.objectives]
    mask = pareto_mask(feasible[cols].to_numpy(float), [o.direction is Direction.MAX for o in space.objectives])
    first = space.objectives[0]
    return feasible[mask].sort_values(first.column, ascending=first.direction is Direction.MIN)


def write_tables(df: pd.DataFrame, front: pd.DataFrame, out: Path) -> list[Path]:
    """candidates.parquet (the table), candidates.csv.gz (the same for spreadsheets: pandas and most tools
    read it compressed; 8 MB as plain text for a flagship study) and pareto.csv."""
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.parquet

    paths = [out / "candidates.parquet", out / "candidates.csv.gz", out / "pareto.csv"]
    # perf: one Arrow table for both files; Arrow's CSV writer is ~10x faster than pandas' (gpt3_1t: 0.04 s
    # against 0.32 s). Its dialect: strings quoted, booleans true/false, floats in shortest form (80, not 80.0)
    table = pa.Table.from_pandas(df, preserve_index=False)
    pyarrow.parquet.write_table(table, paths[0])
    sink = pa.BufferOutputStream()
    pyarrow.csv.write_csv(table, sink)
    paths[1].write_bytes(gzip.compress(sink.getvalue().to_pybytes(), compresslevel=3, mtime=0))
    front.to_csv(paths[2], index=False)
    (out / "candidates.csv").unlink(missing_ok=True)   # the plain copy an earlier version wrote
    return paths


def write_study_yaml(space: SearchSpace, out: Path, resolved: dict) -> Path:
    """The space as given, plus what was resolved (paths, seed, trials, fingerprint)."""
    doc = dict(space.raw)
    doc["resolved"] = resolved
    path = out / "study.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
