"""The journal: lines compressed as they are written (Journal._pack) give the same journal.jsonl.gz as
compressing the finished file, and a key written twice falls back to one line per key (the last)."""

from __future__ import annotations

import gzip
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from comet.search.results import Journal

records = st.lists(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(allow_nan=True)), max_size=5),
                   min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(chunks=records)
def test_compacted_journal_holds_the_last_record_of_each_key(tmp_path_factory, chunks):
    path = tmp_path_factory.mktemp("journal") / "journal.jsonl"
    journal, written, last = Journal(path), [], {}
    for chunk in chunks:                         # one flush per chunk, as the driver does
        for key, value in chunk:
            rec = {"key": key, "value": value}
            journal.append(rec)
            written.append(json.dumps(rec, allow_nan=True) + "\n")
            last[key] = rec
        journal.flush()
    journal.compact()
    if not written:
        assert not journal.gz.exists()
        return
    assert not path.exists() and not journal.gz.with_name(journal.gz.name + ".tmp").exists()
    lines = gzip.decompress(journal.gz.read_bytes()).decode().splitlines(keepends=True)
    if len(last) == len(written):                # distinct keys: the lines as written, in order
        assert lines == written
    assert json.dumps(Journal(path).load(), allow_nan=True) == json.dumps(last, allow_nan=True)


def test_resumed_journal_keeps_earlier_lines(tmp_path):
    """A second run's lines join the first run's compressed ones (not streamed: the file was not new)."""
    path = tmp_path / "journal.jsonl"
    first = Journal(path)
    first.append({"key": "a", "v": 1})
    first.compact()
    again = Journal(path)
    again.append({"key": "b", "v": 2})
    again.flush()
    again.compact()
    assert Journal(path).load() == {"a": {"key": "a", "v": 1}, "b": {"key": "b", "v": 2}}


def test_a_record_rebuilds_every_enum_field_as_its_member():
    # the rules and models compare enum members by identity: a value read back from the journal as a
    # string (selective_policy, recompute_modules) hashed and compared equal to the member, so the cache
    # served the member's figures after the configuration was seen and the string's otherwise (a timeline
    # drawn on a Ray worker differed from the serial one)
    import dataclasses
    import enum
    import json

    from comet.config.moe import Dispatcher
    from comet.config.parallel import (OffloadTarget, ParallelConfig, Precision, Recompute, RecomputeModule,
                                       Schedule, SelectivePolicy)
    from comet.search.context import _parallel_forms
    from comet.search.driver import candidate_from_record

    par = ParallelConfig(global_batch=256, tp=4, pp=8, gpus=128, vpp=2, schedule=Schedule.INTERLEAVED,
                         recompute=Recompute.SELECTIVE, selective_policy=SelectivePolicy.OP_SAC,
                         recompute_modules=(RecomputeModule.LAYERNORM, RecomputeModule.MOE_ACT),
                         precision=Precision.FP8, moe_dispatcher=Dispatcher.ALLGATHER,
                         offload=(OffloadTarget.OPTIMIZER,))
    rec = {"key": "k", "number": 0, "provision": {}, "parallel": json.loads(_parallel_forms(par)[2])}
    back = candidate_from_record(rec).parallel
    assert back == par
    for f in dataclasses.fields(par):
        want, got = getattr(par, f.name), getattr(back, f.name)
        for w, g in zip(want, got) if isinstance(want, tuple) else ((want, got),):
            assert type(g) is type(w) and (g is w if isinstance(w, enum.Enum) else g == w), f.name
