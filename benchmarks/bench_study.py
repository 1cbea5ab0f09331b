"""The gpt3_1t study end to end, as a user runs it (`make bench`): `comet search
search_spaces/gpt3_1t.yaml` in a fresh process and results folder, with `--executor serial` pinned to
one CPU (os.sched_setaffinity: "per core" is then what it says), and with `--executor ray --workers 2`
(unpinned: two workers and the driver). Runs alternate (serial, Ray, serial, ...) so both see the same
load on a shared machine; each figure is the median of REPEATS runs.

- study_gpt3_1t_serial_candidates_per_s: replayed candidates (not pruned) / wall seconds of the process,
  interpreter start, imports, listing and writing included.
- study_gpt3_1t_ray2_over_serial: the same rate with Ray over the serial one, everything included (Ray's
  own start and shut-down too); also without start-up and over the evaluation phase alone.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 3


@dataclass
class StudyRun:
    """One `comet search` of the gpt3_1t space in a fresh process: wall and CPU seconds of the process,
    and the driver's own split read from summary.md's run line (comet/search/driver.py: start-up =
    context, executor start and candidate listing; writing = journal, tables, plots, timelines)."""
    executor: str
    evaluated: int
    wall_s: float
    cpu_s: float
    phases: dict

    @property
    def rate(self) -> float:
        """Replayed candidates per wall second, start-up and writing included."""
        return self.evaluated / self.wall_s

    @property
    def start_up_s(self) -> float:
        """Everything but evaluation and writing: interpreter, imports and the driver's start-up (context,
        executor start, candidate listing), and after the driver's clock stops summary.md, the printed
        table and any part of Ray's shut-down not hidden behind the writing."""
        return self.wall_s - self.phases["evaluation"] - self.phases["writing"]


def _one_cpu() -> None:
    """preexec_fn: the serial study on one CPU (the one this process may use first)."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def study_run(executor: str = "serial", workers: int | None = None) -> StudyRun:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "comet", "search", str(ROOT / "search_spaces" / "gpt3_1t.yaml"),
               "--executor", executor, "--out", str(Path(tmp) / "study")]
        if workers:
            cmd += ["--workers", str(workers)]
        pin = _one_cpu if executor == "serial" and hasattr(os, "sched_setaffinity") else None
        t0, c0 = time.perf_counter(), _children_cpu()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, preexec_fn=pin)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
        summary = (Path(tmp) / "study" / "summary.md").read_text()
    evaluated = int(re.search(r"(\d+) candidates evaluated now", summary).group(1))
    phases = {k: float(v) for k, v in re.findall(r"(start-up|evaluation|writing) ([\d.]+) s", summary)}
    return StudyRun(executor, evaluated, wall, cpu, phases)


def _median_run(runs: list[StudyRun]) -> StudyRun:
    """The run of median wall time (its split and counts belong together)."""
    return sorted(runs, key=lambda r: r.wall_s)[len(runs) // 2]


def _warm_bytecode() -> None:
    """A warm virtual environment has comet's bytecode compiled (pip compiles what it installs; a checkout
    writes __pycache__ on its first run). Where PYTHONDONTWRITEBYTECODE is set nothing is ever written, and
    every fresh process compiled comet's ~120 modules from source again (~0.1 CPU-s of each run, measured
    with -X importtime / cProfile: builtins.compile under importlib). Compiled once here, read by each run."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "comet")], check=True,
                   capture_output=True)


@pytest.mark.bench
def test_bench_study_gpt3_1t():
    _warm_bytecode()
    print(f"\nBENCH study_loadavg_1min_before {os.getloadavg()[0]:.2f} processes")
    serial_runs, ray_runs = [], []
    for _ in range(REPEATS):
        serial_runs.append(study_run())
        ray_runs.append(study_run("ray", workers=2))
    serial, ray2 = _median_run(serial_runs), _median_run(ray_runs)
    print(f"BENCH study_gpt3_1t_serial_candidates {serial.evaluated}")
    print(f"BENCH study_gpt3_1t_serial_wall_s {serial.wall_s:.2f} s (runs: "
          + ", ".join(f"{r.wall_s:.2f}" for r in serial_runs) + ")")
    print(f"BENCH study_gpt3_1t_serial_candidates_per_s {serial.rate:.0f} candidates/s on one core")
    print(f"BENCH study_gpt3_1t_serial_cpu_s {serial.cpu_s:.2f} s (candidates per CPU second: "
          f"{serial.evaluated / serial.cpu_s:.0f})")
    for run in (serial, ray2):
        name = "serial" if run.executor == "serial" else "ray2"
        print(f"BENCH study_gpt3_1t_{name}_split start-up and exit {run.start_up_s:.2f} s (driver start-up "
              f"{run.phases['start-up']:.2f} s), evaluation {run.phases['evaluation']:.2f} s, writing "
              f"{run.phases['writing']:.2f} s")
    print(f"BENCH study_gpt3_1t_ray2_wall_s {ray2.wall_s:.2f} s (runs: "
          + ", ".join(f"{r.wall_s:.2f}" for r in ray_runs) + ")")
    print(f"BENCH study_gpt3_1t_ray2_candidates_per_s {ray2.rate:.0f} candidates/s")
    print(f"BENCH study_gpt3_1t_ray2_over_serial {ray2.rate / serial.rate:.2f} x")
    # without start-up: wall from the first evaluation to the end (Ray's own start is seconds, paid once)
    no_start = (serial.wall_s - serial.start_up_s) / (ray2.wall_s - ray2.start_up_s)
    print(f"BENCH study_gpt3_1t_ray2_over_serial_without_start_up {no_start:.2f} x")
    print(f"BENCH study_gpt3_1t_ray2_over_serial_evaluation_only "
          f"{serial.phases['evaluation'] / ray2.phases['evaluation']:.2f} x")
    print(f"BENCH study_loadavg_1min_after {os.getloadavg()[0]:.2f} processes")
    assert all(r.evaluated == serial.evaluated > 0 for r in serial_runs + ray_runs)


def _children_cpu() -> float:
    import resource
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
