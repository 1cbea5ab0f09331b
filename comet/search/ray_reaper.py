"""Watchdog of a private local Ray: when the search process dies without shutting Ray down (SIGKILL,
OOM killer), kill the Ray processes it had started and remove Ray's temp dir.

Ray's GCS and raylet exit with their driver, but its dashboard and runtime-env agents, reparented to
init, keep running for minutes trying to report to a dead GCS. This process (started by
ray_runtime.start_local, `python -m comet.search.ray_reaper DRIVER_PID TEMP_DIR`) records the driver's
descendants every second and kills what is left of them once the driver is gone. A normal run stops it
after `ray.shutdown()`.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import psutil

POLL_S = 1.0
GRACE_S = 2.0    # SIGTERM first, SIGKILL after this


def _descendants(driver: psutil.Process) -> dict[int, float]:
    me = os.getpid()
    out = {}
    for p in driver.children(recursive=True):
        try:
            if p.pid != me:
                out[p.pid] = p.create_time()
        except psutil.Error:
            continue
    return out


def _alive(known: dict[int, float]) -> list[psutil.Process]:
    """The recorded processes still running (same pid and start time: not a reused pid)."""
    procs = []
    for pid, created in known.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created:
                procs.append(p)
        except psutil.Error:
            continue
    return procs


def watch(driver_pid: int, temp_dir: str) -> None:
    try:
        driver = psutil.Process(driver_pid)
    except psutil.Error:
        return
    known: dict[int, float] = {}
    while driver.is_running() and driver.status() != psutil.STATUS_ZOMBIE:
        try:
            known.update(_descendants(driver))
        except psutil.Error:
            break
        time.sleep(POLL_S)
    left = _alive(known)
    for p in left:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(left, timeout=GRACE_S)
    for p in still:
        try:
            p.kill()
        except psutil.Error:
            pass
    shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
