"""The CLI's last line of defence: an exception nobody anticipated is a bug of comet, not of the input.

It becomes one line on stderr naming what failed and where, with the path of a crash report holding the
full traceback, and exit code 3. Environment failures that carry a file name (a full disk, a read-only
folder) are not bugs: one line naming the file and exit code 2.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

BUG_EXIT = 3
# OS errors that the user's environment causes (not comet): reported as one line, exit 2
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT,
                      errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.EEXIST, errno.EMFILE, errno.EIO}


def environment_error_line(exc: BaseException) -> str | None:
    """One line for an OSError caused by the environment (names the file), else None."""
    if isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS:
        name = exc.filename if exc.filename is not None else "output"
        why = exc.strerror or os.strerror(exc.errno)
        hint = " (free some space, then run the same command again to resume)" if exc.errno in (
            errno.ENOSPC, errno.EDQUOT) else ""
        return f"cannot write or read {name}: {why}{hint}"
    return None


def crash_dir() -> Path:
    """Where crash reports go: $COMET_CRASH_DIR, else a per-user folder in the system temp dir."""
    env = os.environ.get("COMET_CRASH_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / f"comet-crash-{os.getuid()}"


def write_crash_report(exc: BaseException, argv: list[str]) -> Path | None:
    """Write the traceback and the command line; None when even that cannot be written."""
    text = (f"comet crash report {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
            f"command: comet {' '.join(argv)}\npython: {sys.version.split()[0]}\n\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    try:
        folder = crash_dir()
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=time.strftime("crash-%Y%m%d-%H%M%S-", time.gmtime()), suffix=".txt",
                                    dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return Path(name)
    except Exception:   # noqa: BLE001 - the report is best effort; the one-line message still goes out
        return None


def where(exc: BaseException) -> str:
    """file:line of the innermost frame inside comet (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f"{os.sep}comet{os.sep}" in f.filename] or frames
    if not ours:
        return "unknown location"
    f = ours[-1]
    path = f.filename
    cut = path.rfind(f"{os.sep}comet{os.sep}")
    return f"{path[cut + 1:] if cut >= 0 else path}:{f.lineno} in {f.name}"


def report_bug(exc: BaseException, argv: list[str], command: str) -> int:
    """Print the one-line bug message and return the bug exit code."""
    report = write_crash_report(exc, argv)
    what = type(exc).__name__
    detail = str(exc).splitlines()[0][:200] if str(exc) else ""
    saved = f"crash report with the traceback: {report}" if report else "the crash report could not be written"
    print(f"comet: internal error (a bug in comet, please report it): `comet {command}` failed with {what}"
          f"{': ' + detail if detail else ''} at {where(exc)}; {saved}", file=sys.stderr)
    return BUG_EXIT
