"""evaluate._memory keys the memory estimate by the batch-free configuration and the micro-batch count as
the estimate reads it (memory.memory_microbatches): global batches that give the same count must give
the same estimate, field for field."""

from hypothesis import given, settings
from hypothesis import strategies as st

from comet.config.model import load_model
from comet.config.parallel import OffloadTarget, ParallelConfig, Recompute, Schedule
from comet.errors import ConfigError
from comet.workload.memory import estimate_memory, memory_microbatches

MODELS = {name: load_model(name) for name in ("gpt3_175b", "llama3_8b", "mixtral_8x7b")}

configs = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2, 8]),
    "pp": st.sampled_from([1, 2, 3, 4, 8]),
    "dp": st.sampled_from([1, 2, 4]),
    "micro_batch": st.sampled_from([1, 2]),
    "schedule_vpp": st.sampled_from([(Schedule.GPIPE, 1), (Schedule.ONE_F_ONE_B, 1), (Schedule.INTERLEAVED, 1),
                                     (Schedule.INTERLEAVED, 2), (Schedule.INTERLEAVED, 3)]),
    "zero": st.sampled_from([0, 1, 3]),
    "fsdp": st.booleans(),
    "recompute": st.sampled_from(list(Recompute)),
    "dropout": st.booleans(),
    "offload": st.sampled_from([(), (OffloadTarget.OPTIMIZER,), (OffloadTarget.ACTIVATIONS,), (OffloadTarget.WEIGHTS,)]),
    "loss_impl": st.sampled_from(["fused", "eager"]),
}, optional={"pp_first_stage_layers": st.sampled_from([1, 2]), "ep": st.sampled_from([1, 2])})


@settings(max_examples=200, deadline=None)
@given(cfg=configs, model=st.sampled_from(sorted(MODELS)))
def test_estimate_depends_on_the_global_batch_only_through_memory_microbatches(cfg, model, h100):
    mod = MODELS[model]
    cfg = dict(cfg)
    cfg["schedule"], cfg["vpp"] = cfg.pop("schedule_vpp")
    per = cfg["dp"] * cfg["micro_batch"]
    seen = {}   # memory_microbatches -> (m, estimate): every micro-batch count up past where in-flight saturates
    for m in range(1, 3 * cfg["pp"] * cfg["vpp"] + 4):
        try:
            par = ParallelConfig(global_batch=m * per, **cfg).resolve(mod)
        except ConfigError:
            continue
        key = memory_microbatches(par)
        assert key <= m and (cfg["schedule"] != Schedule.GPIPE or key == m)
        first = seen.setdefault(key, (m, estimate_memory(mod, par, h100)))
        assert estimate_memory(mod, par, h100) == first[1], (m, first[0])
