"""loader.from_dict takes a fast path where every value is plain (of its field's exact type, within its
rules); it must build what the strict path builds, and leave every other input to the strict path, which
raises the error it always raised."""

import dataclasses
import enum
import types
import typing

from hypothesis import given, settings
from hypothesis import strategies as st

from comet.config.cluster import GpuSpec, NetworkDim
from comet.config.loader import _from_dict_strict, from_dict
from comet.config.model import ModelSpec
from comet.config.moe import MoESpec
from comet.config.parallel import OffloadTarget, ParallelConfig, Precision, Recompute, Schedule
from comet.errors import ConfigError

CLASSES = (ParallelConfig, ModelSpec, MoESpec, GpuSpec, NetworkDim)
ENUM_VALUES = [e.value for enum in (Schedule, Recompute, Precision, OffloadTarget) for e in enum]
values = st.one_of(
    st.integers(-3, 70), st.integers(-10**20, 10**20), st.sampled_from([0, 1, 10**18, 10**18 + 1, -10**18 - 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.5, 1e18, 2e18]),
    st.booleans(), st.none(), st.sampled_from(ENUM_VALUES + ["", "nope", "8.0e6", "1"]),
    st.sampled_from(list(Schedule) + list(Recompute) + list(OffloadTarget)),
    st.lists(st.sampled_from(ENUM_VALUES + [1, None]), max_size=3), st.tuples(st.sampled_from(list(OffloadTarget))),
    st.dictionaries(st.sampled_from(["bf16", "fp8"]), st.floats(-1, 1e3), max_size=2))


def _plain_values(tp):
    """Values the fast path takes for annotation tp (None where it takes none)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = _plain_values(args[0])
        return None if inner is None else st.none() | inner
    if origin is tuple and args and isinstance(args[0], type) and issubclass(args[0], enum.Enum):
        return st.lists(st.sampled_from([m.value for m in args[0]]), max_size=2)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from([m.value for m in tp] + list(tp))
    return {int: st.sampled_from([1, 2, 8]), float: st.sampled_from([0.5, 1.0, 3]), bool: st.booleans(),
            str: st.sampled_from(["fp32", "x"])}.get(tp)


@st.composite
def requests(draw):
    """A request of plain values (the fast path's case), some of them then replaced by anything."""
    cls = draw(st.sampled_from(CLASSES))
    hints = typing.get_type_hints(cls)
    fields = {f.name: _plain_values(hints[f.name]) for f in dataclasses.fields(cls)}
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    keys = list(dict.fromkeys(required + draw(st.lists(st.sampled_from([k for k, v in fields.items() if v is not None]),
                                                         unique=True))))
    data = {k: draw(fields[k]) if fields.get(k) is not None else draw(values) for k in keys}
    for k in draw(st.lists(st.sampled_from(list(fields) + ["no_such_key", 7]), max_size=2)):
        if draw(st.booleans()):
            data[k] = draw(values)
        else:
            data.pop(k, None)
    return cls, data


def _outcome(fn):
    try:
        obj = fn()
    except ConfigError as exc:
        return "config error", str(exc), exc.field, exc.source
    except Exception as exc:     # what the strict path lets through must come through alike
        return type(exc).__name__, str(exc)
    return "ok", type(obj), list(vars(obj).items())


@settings(max_examples=1500, deadline=None)
@given(req=requests(), path=st.sampled_from(["", "parallel"]))
def test_fast_path_equals_the_strict_loader(req, path):
    cls, data = req
    assert _outcome(lambda: from_dict(cls, data, source="x.yaml", path=path)) == \
        _outcome(lambda: _from_dict_strict(cls, data, "x.yaml", path))


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({"global_batch": st.integers(1, 4096)}, optional={
    "tp": st.integers(1, 16), "pp": st.integers(1, 64), "gpus": st.none() | st.integers(1, 8192),
    "recompute": st.sampled_from([r.value for r in Recompute]), "schedule": st.sampled_from([s.value for s in Schedule]),
    "sequence_parallel": st.none() | st.booleans(), "offload": st.lists(st.sampled_from([o.value for o in OffloadTarget])),
    "moe_imbalance": st.floats(1, 8) | st.integers(1, 8), "zero": st.integers(0, 3)}))
def test_plain_requests_take_the_fast_path_and_build_the_same_configuration(data):
    from comet.config import loader
    assert loader._from_plain_values(ParallelConfig, data, "", "") is not loader._SLOW
    fast, strict = from_dict(ParallelConfig, data), _from_dict_strict(ParallelConfig, data, "", "")
    assert fast == strict and hash(fast) == hash(strict) and list(vars(fast).items()) == list(vars(strict).items())
