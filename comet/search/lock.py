"""One search at a time per results folder: an exclusive lock on `<out>/.lock`.

Two searches writing one journal would both redo the work (grid) or corrupt the Optuna storage (a
second process telling trials of the first). The second search refuses with a clear line instead. The
lock is an advisory `flock`, so the kernel releases it when its holder dies (kill -9 included): a
stale lock file never blocks a re-run.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from comet.errors import ConfigError

LOCK_NAME = ".lock"


class ResultsLock:
    def __init__(self, folder: Path):
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> "ResultsLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(f"results folder {self.path.parent} is in use by another search ({holder}); "
                              "wait for it to finish, or give a different --out", field="--out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "ResultsLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
