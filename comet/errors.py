"""Exceptions named for the failure. The CLI turns each into one line and exit code 2."""

from __future__ import annotations


class CometError(Exception):
    """Base class: an input problem the user can fix. Never shown as a traceback."""


class ConfigError(CometError):
    """A configuration file or flag breaks a rule: names the file, the field and the value."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        where = ": ".join(p for p in (source, field) if p)
        super().__init__(f"{where}: {message}" if where else message)


class TraceError(CometError):
    """A trace file is truncated, corrupt, foreign or inconsistent: names the file and the problem."""

    def __init__(self, message: str, *, path: str | None = None):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class GraphError(CometError):
    """An execution graph is malformed (dependency cycle, unmatched collective, ...)."""


class UnsupportedError(CometError):
    """A feature that is parsed but not modelled yet (e.g. mixture of experts)."""
