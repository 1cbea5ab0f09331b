"""kill -9 at ~50% of a search, re-run, compare with an uninterrupted run (`make kill-check`).

    python tests/robust/kill9_check.py [--space search_spaces/gpt3_175b.yaml] [--executor serial] [--at 0.5]

1. runs the search uninterrupted into A (timed);
2. runs it again into B and sends SIGKILL to its whole process group once B's journal holds `--at` of
   the candidates;
3. re-runs into B (a resume) and reads how many candidates it evaluated and how many it resumed;
4. compares B's final candidates.parquet with A's (same keys, equal metrics) and checks that the re-run
   evaluated exactly the candidates missing from the journal the kill left.
Exit 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[2]
METRICS = ["status", "reason", "step_time_s", "tokens_per_s", "mfu", "memory_gb_per_gpu", "time_to_train_days",
           "cost_per_run_usd"]


def _cmd(space: str, out: Path, executor: str) -> list[str]:
    return [sys.executable, "-m", "comet", "search", space, "--executor", executor, "--no-timelines", "--out", str(out)]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _journal_keys(folder: Path) -> set[str]:
    keys = set()
    path = folder / "journal.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                keys.add(json.loads(line)["key"])
            except (json.JSONDecodeError, KeyError, TypeError):
                pass          # the line the kill cut short: evaluated again by the resume
    return keys


def _widened(space: Path, work: Path) -> str:
    """The space with 5 GPU counts, 5 scale-out bandwidths, 4 HBM sizes, 2 NVLink domain sizes and 4
    micro-batch sizes (14,400 grid points on the gpt3_175b space: about a minute serial)."""
    doc = yaml.safe_load(space.read_text())
    spec = Path(doc["cluster"]["spec"])
    doc["cluster"]["spec"] = str(spec if spec.is_absolute() else (space.parent / spec).resolve())
    doc["cluster"].update(gpus=[128, 256, 512, 768, 1024], scaleout_bandwidth_GBps=[12.5, 25, 50, 100, 200],
                          hbm_GB=[80, 96, 141, 192], scaleup_size=[8, 16])
    doc["parallel"].update(micro_batch=[1, 2, 4, 8])
    path = work / "space.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default=str(REPO / "search_spaces" / "gpt3_175b.yaml"))
    ap.add_argument("--executor", default="serial", choices=("serial", "ray"))
    ap.add_argument("--at", type=float, default=0.5, help="kill when this fraction is journaled (default 0.5)")
    ap.add_argument("--work", help="folder for the runs (default: a temp folder)")
    ap.add_argument("--as-is", action="store_true",
                    help="run --space unchanged (default: widen its axes so the search takes ~60 s)")
    a = ap.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="comet-kill9-"))
    work.mkdir(parents=True, exist_ok=True)
    full, cut = work / "uninterrupted", work / "killed"
    if not a.as_is:
        a.space = _widened(Path(a.space), work)

    t0 = time.monotonic()
    done = subprocess.run(_cmd(a.space, full, a.executor), env=_env(), capture_output=True, text=True)
    t_full = time.monotonic() - t0
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:])
        return 1
    reference = pd.read_parquet(full / "candidates.parquet")
    total = len(reference)
    print(f"uninterrupted: {total} candidates in {t_full:.1f} s")

    proc = subprocess.Popen(_cmd(a.space, cut, a.executor), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    while proc.poll() is None and len(_journal_keys(cut)) < a.at * total:
        time.sleep(0.05)
    t_kill = time.monotonic() - t0
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _journal_keys(cut)
    print(f"killed with SIGKILL after {t_kill:.1f} s: {len(before)} of {total} candidates "
          f"({len(before) / total:.0%}) in the journal")

    t0 = time.monotonic()
    again = subprocess.run(_cmd(a.space, cut, a.executor), env=_env(), capture_output=True, text=True)
    t_again = time.monotonic() - t0
    m = re.search(r"evaluated (\d+) now \+ (\d+) resumed", again.stdout)
    if again.returncode != 0 or not m:
        print(again.stdout[-2000:], again.stderr[-2000:])
        return 1
    now, resumed = int(m.group(1)), int(m.group(2))
    print(f"re-run: evaluated {now} now + {resumed} resumed in {t_again:.1f} s")

    final = pd.read_parquet(cut / "candidates.parquet")
    cols = ["key"] + [c for c in METRICS if c in reference.columns]
    a_df = reference[cols].sort_values("key").reset_index(drop=True)
    b_df = final[cols].sort_values("key").reset_index(drop=True)
    same = a_df.equals(b_df)
    missing = total - len(before)
    checks = {"final candidates equal the uninterrupted run's": same,
              f"the re-run evaluated only the {missing} missing": now == missing and resumed == len(before),
              "the kill came at 30-70%": 0.3 <= len(before) / total <= 0.7}
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    if not same:
        diff = a_df.compare(b_df) if len(a_df) == len(b_df) else f"{len(a_df)} vs {len(b_df)} rows"
        print(diff)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
