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
from typing import Any, Callable, TypeVar

from comet.config.document import MAX_MAGNITUDE, check_scalar, read_yaml
from comet.config.frozen import plain_dataclass
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
    if type(data) is dict:
        built = _from_plain_values(cls, data, source, path)
        if built is not _SLOW:
            return built
    return _from_dict_strict(cls, data, source, path)


def _from_dict_strict(cls: type[T], data: Any, source: str, path: str) -> T:
    """from_dict's reference path: every field through convert() and _check_bounds(), in field order."""
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
    return _construct(cls, kwargs, source, path)


def _construct(cls: type[T], kwargs: dict, source: str, path: str) -> T:
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if exc.source is None:  # a cross-field rule raised in __post_init__: add where it came from
            raise ConfigError(str(exc), source=source, field=_join(path, exc.field) if exc.field else (path or None)) from None
        raise


# ------------------------------------------------------------------------------ plain values, fast
# perf (i18g-glue): comet.estimate() gives a ParallelConfig a few plain values (ints, bools, enum names);
# the strict path above walks every field, converts each value through the annotation's generic rules
# and runs the dataclass __init__ over ~45 fields (17 us). Where every value given is of its field's
# exact type and within its rules, the converted value is the value itself (or the enum member, or a
# tuple of them) and the object is its defaults updated with the values (~4 us). Anything else (a
# wrong type, a broken bound, a missing or unknown key, a nested dataclass) goes the strict way, which
# raises the error it always raised (tests/config/test_loader_fast.py compares both paths).
_SLOW = object()    # what a fast converter returns for a value it leaves to the strict path


def _from_plain_values(cls: type, data: dict, source: str, path: str) -> Any:
    plan = _fast_plan(cls)
    if plan is None:
        return _SLOW
    converters, required, defaults = plan
    kwargs = {}
    for name, value in data.items():
        fast = converters.get(name)
        if fast is None:
            return _SLOW
        value = fast(value)
        if value is _SLOW:
            return _SLOW
        kwargs[name] = value
    if not required <= kwargs.keys():
        return _SLOW
    if defaults is None:
        return _construct(cls, kwargs, source, path)
    obj = object.__new__(cls)
    state = obj.__dict__
    state.update(defaults)      # every field, in field order, as the generated __init__ stores them
    state.update(kwargs)
    return obj


@functools.lru_cache(maxsize=None)
def _fast_plan(cls: type) -> tuple | None:
    """({field: fast converter}, required field names, defaults for a plain class or None), or None for a
    class without fields the fast path can convert."""
    if not dataclasses.is_dataclass(cls):
        return None
    hints = _type_hints(cls)
    fields = _init_fields(cls)
    converters = {name: conv for name, f in fields.items()
                  if (conv := _fast_converter(hints[name], tuple(f.metadata.items()))) is not None}
    if not converters:
        return None
    required = frozenset(name for name, f in fields.items()
                         if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    plain = plain_dataclass(cls) and all(f.default_factory is dataclasses.MISSING for f in fields.values())
    defaults = {name: f.default for name, f in fields.items()} if plain else None
    return converters, required, defaults


@functools.lru_cache(maxsize=None)
def _fast_converter(tp: Any, meta: tuple) -> Callable[[Any], Any] | None:
    """For annotation `tp` with bounds `meta`: a function giving convert()'s value for a value of the exact
    type that passes convert()'s checks and the bounds, else _SLOW; None where there is no fast path."""
    origin, args, _ = _shape(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        conv = _fast_converter(inner[0], meta) if len(inner) == 1 and len(args) == 2 else None
        return None if conv is None else (lambda v: None if v is None else conv(v))
    if origin in (tuple, list) and args and (len(args) == 1 or args[1] is Ellipsis):
        conv = _fast_converter(args[0], meta)
        if conv is None:
            return None

        def items(v):
            if type(v) is not list and type(v) is not tuple:
                return _SLOW
            out = tuple(map(conv, v))
            return _SLOW if _SLOW in out else out
        return items
    if isinstance(tp, type) and issubclass(tp, enum.Enum) and not issubclass(tp, (int, float)):
        members = {m.value: m for m in tp if isinstance(m.value, str)}
        return lambda v: members.get(v, _SLOW) if type(v) is str else (v if type(v) is tp else _SLOW)
    if tp is bool:
        return lambda v: v if type(v) is bool else _SLOW
    if tp is str:
        return lambda v: v if type(v) is str else _SLOW
    rules = tuple((ok, bound) for key, ok, _ in _BOUNDS for k, bound in meta if k == key)
    if tp is int:
        return lambda v: v if type(v) is int and -MAX_MAGNITUDE <= v <= MAX_MAGNITUDE and _within(v, rules) else _SLOW
    if tp is float:
        return lambda v: (float(v) if (type(v) is float or type(v) is int)   # NaN and inf fail the range
                          and -MAX_MAGNITUDE <= v <= MAX_MAGNITUDE and _within(float(v), rules) else _SLOW)
    return None


def _within(value: float, rules: tuple) -> bool:
    for ok, bound in rules:
        if not ok(value, bound):
            return False
    return True


def load(cls: type[T], path: str | Path) -> T:
    """Read YAML file `path` into dataclass `cls`."""
    return from_dict(cls, read_yaml(path), source=str(path))
