"""evaluate.resolve resolves a configuration's batch-free part once and checks only the rules that read
the global batch for each batch (ParallelConfig.check_batch): it must give what ParallelConfig.resolve
gives, the same configuration or the same first broken rule, on any configuration."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comet.config.cluster import load_cluster
from comet.config.model import load_model
from comet.config.parallel import MAX_MICROBATCHES, OffloadTarget, ParallelConfig, Recompute, Schedule
from comet.errors import ConfigError
from comet.evaluate import resolve
from comet.replay import cache

MODELS = {name: load_model(name) for name in ("gpt3_175b", "llama3_8b", "mixtral_8x7b")}

configs = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2, 3, 4, 8]),
    "pp": st.sampled_from([1, 2, 3, 4, 8]),
    "cp": st.sampled_from([1, 2, 3]),
    "micro_batch": st.sampled_from([1, 2, 3]),
    "schedule": st.sampled_from(list(Schedule)),
    "vpp": st.sampled_from([1, 2, 3]),
    "zero": st.sampled_from([0, 1, 2, 3, 4]),
    "fsdp": st.booleans(),
    "recompute": st.sampled_from(list(Recompute)),
}, optional={
    "gpus": st.sampled_from([8, 12, 16, 64, 96, 128, 1024]),
    "dp": st.sampled_from([0, 1, 2, 3, 8]),
    "sequence_parallel": st.booleans(),
    "ep": st.sampled_from([1, 2, 4, 8]),
    "offload": st.sampled_from([(), (OffloadTarget.OPTIMIZER,), (OffloadTarget.OPTIMIZER, OffloadTarget.OPTIMIZER)]),
    "moe_imbalance": st.sampled_from([1.0, 1.5, 16.0]),
})
batches = st.lists(st.sampled_from([1, 6, 8, 24, 64, 96, 128, 1536, 8 * (MAX_MICROBATCHES + 8)]), min_size=1, max_size=4)


def _outcome(fn):
    try:
        par = fn()
    except ConfigError as exc:
        return "error", str(exc), exc.field
    return "ok", par, tuple(getattr(par, f) for f in ParallelConfig.__dataclass_fields__)


@settings(max_examples=300, deadline=None)
@given(cfg=configs, model=st.sampled_from(sorted(MODELS)), gbs=batches)
def test_resolve_per_batch_equals_the_full_resolve(cfg, model, gbs):
    m = MODELS[model]
    cluster = load_cluster("h100_dgx")
    cache.clear()
    for gb in gbs:   # the later batches find the batch-free part resolved (or its error raised again)
        par = ParallelConfig(global_batch=gb, **cfg)
        with cache.disabled():
            reference = _outcome(lambda: resolve(m, cluster, par))
        assert _outcome(lambda: resolve(m, cluster, par)) == reference
        if reference[0] == "ok":   # the label and batch-free key carried over are the configuration's own
            got = resolve(m, cluster, par)
            assert _outcome(lambda: par.resolve(m)) == reference
            assert got.label() == got._make_label() and got.batch_free() == ParallelConfig.batch_free(
                ParallelConfig(**{f: getattr(got, f) for f in ParallelConfig.__dataclass_fields__}))


def test_check_batch_is_the_global_batch_rules_in_order(gpt3_175b):
    par = ParallelConfig(tp=8, pp=8, gpus=512, global_batch=100, vpp=2, schedule=Schedule.INTERLEAVED).resolve(
        gpt3_175b, batch=False)
    with pytest.raises(ConfigError, match=r"global_batch \(100\) must be divisible by dp\*micro_batch = 8\*1 = 8"):
        par.check_batch()
    with pytest.raises(ConfigError, match="interleaved 1F1B needs the micro-batch count"):
        par.with_global_batch(8 * 12).check_batch()
    par.with_global_batch(8 * 16).check_batch()
