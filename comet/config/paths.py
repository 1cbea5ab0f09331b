"""Output locations and path flags checked before any work starts.

A timeline that cannot be written should fail in milliseconds, not after the whole computation.
Every check raises ConfigError naming the flag, the rule and the path.
"""

from __future__ import annotations

import os
from pathlib import Path

from comet.errors import ConfigError

# argparse dests that name a file comet will write, and those that name a folder it will create/fill
OUTPUT_FILES = {"timeline": "--timeline", "output": "--output"}
OUTPUT_DIRS = {"out": "--out", "chakra_out": "--chakra-out"}
MAX_PATH = 4096     # PATH_MAX on Linux


def check_path_text(path: str, flag: str) -> None:
    """A path must be non-empty text without NUL bytes and within PATH_MAX."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"must be a non-empty path, got {path!r}", field=flag)
    if "\x00" in path:
        raise ConfigError(f"a path cannot contain a NUL byte, got {path!r}", field=flag)
    if len(os.fsencode(path)) > MAX_PATH:
        raise ConfigError(f"path longer than {MAX_PATH} bytes ({len(path)} characters)", field=flag)


def _nearest_existing(p: Path) -> Path:
    p = p.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output_file(path: str, flag: str) -> None:
    """The file can be created: its folder exists and is writable, and the path is not a folder."""
    check_path_text(path, flag)
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"must be a file path, but {path} is a folder", field=flag)
    parent = p.absolute().parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise ConfigError(f"cannot write {path}: the folder {parent} {what}", field=flag)
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"cannot write {path}: permission denied", field=flag)


def check_output_dir(path: str, flag: str) -> None:
    """The folder exists and is writable, or can be created under a writable folder."""
    check_path_text(path, flag)
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"must be a folder, but {path} is a file", field=flag)
    base = _nearest_existing(p)
    if not base.is_dir():
        raise ConfigError(f"cannot create folder {path}: {base} is a file", field=flag)
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write to {base if base != p.absolute() else path}: permission denied",
                          field=flag)


def check_args_paths(args) -> None:
    """Check every path-valued flag of a parsed command line (called by the CLI before running it)."""
    for dest, flag in OUTPUT_FILES.items():
        value = getattr(args, dest, None)
        if isinstance(value, str):
            check_output_file(value, flag)
    # `validate --json OUT` names a file; `trace ... --json` is a switch
    if isinstance(getattr(args, "json", None), str):
        check_output_file(args.json, "--json")
    if getattr(args, "docs", None):       # `validate --docs` alone means the default page
        check_output_file(args.docs, "--docs")
    for dest, flag in OUTPUT_DIRS.items():
        value = getattr(args, dest, None)
        if isinstance(value, str):
            check_output_dir(value, flag)
    for dest, value in vars(args).items():
        if isinstance(value, str) and "\x00" in value:
            check_path_text(value, "--" + dest.replace("_", "-"))
