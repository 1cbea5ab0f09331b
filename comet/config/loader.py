"""One strict loader from YAML mappings to frozen dataclasses.

Every problem is reported as `file: dotted.path[idx].field <what is wrong>, got <value>`; unknown and
missing keys are rejected. Field constraints live in dataclass field metadata:

    bandwidth_GBps: float = field(metadata=positive())

so a rule is written once, beside the field it constrains.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from comet.config.document import check_scalar, read_yaml
from comet.errors import ConfigError

# perf: a dataclass's resolved annotations do not change; resolving them compiles every string annotation
_type_hints = functools.lru_cache(maxsize=None)(typing.get_type_hints)

T = TypeVar("T")


@functools.lru_cache(maxsize=None)
def _init_fields(cls: type) -> dict:
    """{name: field} of a dataclass's __init__ fields (a class's fields do not change)."""
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def positive() -> dict:
    return {"gt": 0}


def non_negative() -> dict:
    return {"ge": 0}


def fraction() -> dict:
    """A value in (0, 1], e.g. an efficiency."""
    return {"gt": 0, "le": 1}


def at_least(low: float) -> dict:
    return {"ge": low}


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


_BOUNDS = (("gt", lambda v, b: v > b, "> {}"), ("ge", lambda v, b: v >= b, ">= {}"),
           ("lt", lambda v, b: v < b, "< {}"), ("le", lambda v, b: v <= b, "<= {}"))


def _check_bounds(value: Any, meta: typing.Mapping, source: str, path: str) -> None:
    """The field's range rule; on a list or mapping of numbers it holds for every item."""
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            _check_bounds(v, meta, source, _join(path, i))
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _check_bounds(v, meta, source, _join(path, str(k)))
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    for key, ok, text in _BOUNDS:
        if key in meta and not ok(value, meta[key]):
            raise ConfigError(f"must be {text.format(meta[key])}, got {value}", source=source, field=path)


@functools.lru_cache(maxsize=None)
def _shape(tp: Any) -> tuple:
    """(origin, args) of an annotation (an annotation does not change; typing's look-ups cost ~1 us)."""
    return typing.get_origin(tp), typing.get_args(tp), dataclasses.is_dataclass(tp)


def convert(tp: Any, value: Any, source: str, path: str) -> Any:
    """Convert a YAML value to the annotated type `tp`, or raise a ConfigError naming `path`."""
    origin, args, is_dataclass = _shape(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for a in inner:
            try:
                return convert(a, value, source, path)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if tp is Any:
        return value
    if is_dataclass:
        return from_dict(tp, value, source=source, path=path)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"must be a list, got {value!r}", source=source, field=path)
        item_t = args[0] if args else Any
        return tuple(convert(item_t, v, source, _join(path, i)) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"must be a mapping, got {value!r}", source=source, field=path)
        kt, vt = args if args else (Any, Any)
        return {convert(kt, k, source, path): convert(vt, v, source, _join(path, str(k))) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            choices = ", ".join(str(m.value) for m in tp)
            raise ConfigError(f"must be one of {choices}, got {value!r}", source=source, field=path) from None
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"must be true or false, got {value!r}", source=source, field=path)
    if tp is int:
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (isinstance(value, float) and not math.isfinite(value)) or int(value) != value):
            raise ConfigError(f"must be an integer, got {value!r}", source=source, field=path)
        check_scalar(int(value), source, path)
        return int(value)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 8.0e6 (no sign in the exponent) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"must be a number, got {value!r}", source=source, field=path)
        check_scalar(value, source, path)     # finite, magnitude bounded (before float() of a huge int)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"must be a string, got {value!r}", source=source, field=path)
        return value
    return value


def from_dict(cls: type[T], data: Any, *, source: str = "", path: str = "") -> T:
    """Build the frozen dataclass `cls` from a mapping, rejecting unknown and missing keys."""
    if not isinstance(data, dict):
        what = "the file" if not path else path
        raise ConfigError(f"{what} must be a mapping of keys to values, got {type(data).__name__}",
                          source=source, field=path or None)
    hints = _type_hints(cls)
    fields = _init_fields(cls)
    unknown = [k for k in data if k not in fields]
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(f"unknown key (known keys: {known})", source=source, field=_join(path, str(unknown[0])))
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError("missing required key", source=source, field=_join(path, name))
            continue
        fpath = _join(path, name)    # perf: only for the keys given (a ParallelConfig has ~40 fields)
        value = convert(hints[name], data[name], source, fpath)
        _check_bounds(value, f.metadata, source, fpath)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if exc.source is None:  # a cross-field rule raised in __post_init__: add where it came from
            raise ConfigError(str(exc), source=source, field=_join(path, exc.field) if exc.field else (path or None)) from None
        raise


def load(cls: type[T], path: str | Path) -> T:
    """Read YAML file `path` into dataclass `cls`."""
    return from_dict(cls, read_yaml(path), source=str(path))
