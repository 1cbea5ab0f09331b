"""config.frozen.replace_fields builds what dataclasses.replace builds."""

import dataclasses
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comet.config.frozen import replace_fields
from comet.config.parallel import ParallelConfig, Recompute, Schedule
from comet.graph.ir import PipelinePlan


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({}, optional={
    "global_batch": st.integers(1, 4096), "tp": st.integers(1, 8), "dp": st.none() | st.integers(1, 64),
    "gpus": st.none() | st.integers(1, 4096), "sequence_parallel": st.none() | st.booleans(),
    "schedule": st.sampled_from(Schedule), "recompute": st.sampled_from(Recompute), "zero": st.integers(0, 3)}))
def test_equals_dataclasses_replace(changes):
    par = ParallelConfig(global_batch=64, tp=2, pp=2, gpus=16)
    new = replace_fields(par, **changes)
    ref = dataclasses.replace(par, **changes)
    assert type(new) is ParallelConfig and new == ref and hash(new) == hash(ref) and repr(new) == repr(ref)
    assert vars(new) == vars(ref) and new is not par and par == ParallelConfig(global_batch=64, tp=2, pp=2, gpus=16)


def test_other_dataclasses_and_unknown_fields():
    plan = PipelinePlan(pp=2, vpp=1, num_microbatches=4, schedule="1f1b", chunk_layers=(1, 1), p2p_bytes=8.0)
    assert replace_fields(plan, num_microbatches=0) == dataclasses.replace(plan, num_microbatches=0)
    with pytest.raises(TypeError):
        replace_fields(ParallelConfig(global_batch=8), no_such_field=1)

    @dataclasses.dataclass(frozen=True)
    class Checked:
        x: int

        def __post_init__(self):
            if self.x < 0:
                raise ValueError("negative")

    with pytest.raises(ValueError):   # a class with __post_init__ goes through replace(), which runs it
        replace_fields(Checked(1), x=-1)


def test_a_cached_property_is_not_copied():
    @dataclasses.dataclass(frozen=True)
    class Derived:
        x: int

        @functools.cached_property
        def double(self) -> int:
            return 2 * self.x

    d = Derived(1)
    assert d.double == 2 and replace_fields(d, x=5).double == 10


def test_parallel_config_keeps_its_hash_out_of_pickles_copies_and_replaced_objects():
    import copy
    import pickle

    par = ParallelConfig(global_batch=64, tp=2, pp=2, gpus=16, recompute=Recompute.FULL)
    fields = tuple(getattr(par, f.name) for f in dataclasses.fields(par))
    assert hash(par) == hash(fields) and hash(par) == hash(par)   # the generated hash's value, kept
    for other in (pickle.loads(pickle.dumps(par)), copy.copy(par), copy.deepcopy(par), replace_fields(par, zero=1)):
        assert "_hash" not in vars(other)
    assert hash(replace_fields(par, zero=1)) == hash(dataclasses.replace(par, zero=1))
    assert pickle.loads(pickle.dumps(par)) == par and repr(copy.copy(par)) == repr(par)


def test_parallel_config_label_kept_and_not_carried():
    par = ParallelConfig(global_batch=64, tp=2, pp=2, gpus=16, dp=4)
    assert par.label() == par.label() == "tp2-pp2-dp4-mb1-none-z1-bf16"
    other = replace_fields(par, dp=8)
    assert other.label() == "tp2-pp2-dp8-mb1-none-z1-bf16" == dataclasses.replace(par, dp=8).label()


def test_values_kept_beside_the_fields_are_dropped_wherever_they_sit():
    par = ParallelConfig(global_batch=64, tp=2, pp=2, gpus=16)
    hash(par), par.label()
    state = par.__dict__
    kept = {"_early": 1, **state}       # a kept value stored before the fields as well
    state.clear()
    state.update(kept)
    new = replace_fields(par, tp=4)
    assert list(vars(new)) == [f.name for f in dataclasses.fields(ParallelConfig)]
    assert new == dataclasses.replace(ParallelConfig(global_batch=64, tp=2, pp=2, gpus=16), tp=4)
