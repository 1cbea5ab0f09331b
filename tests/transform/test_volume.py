"""Per-rank communication volume of a transformed graph equals the analytical volume of the target
configuration, written here from Megatron-LM's rules (not from the builder):

- Tensor parallelism (Shoeybi et al. 2019; Korthikanti et al. 2022 sec. 4.2.2), per layer and
  micro-batch, buffers of b*s/cp*h 16-bit values: without sequence parallelism two all-reduces forward
  and two backward; with it two all-gathers + two reduce-scatters forward, and backward the same four
  plus two re-gathers of the layer input for the weight gradients. Full recompute repeats the forward.
  Vocab-parallel embedding: one all-reduce (SP: reduce-scatter) forward, SP backward one all-gather.
  Output layer: SP all-gather of its input, three fp32 all-reduces of b*s/cp values in the
  cross-entropy (max, sum of exp, target logit); backward the dgrad all-reduce (SP: all-gather of the
  input + reduce-scatter of the dgrad).
- Context parallelism (ring attention, Megatron-Core): cp - 1 K/V block exchanges per attention forward,
  K/V and their gradients backward.
- Data parallelism (Megatron distributed optimizer): fp32 gradients reduce-scattered (ZeRO >= 1) or
  all-reduced, bf16 parameters all-gathered (ZeRO 1, 2); the stage holds layers/pp layers of
  12h^2 + 13h parameters / tp (GPT layer, Narayanan et al. SC21 eq. 2 without the 1/L terms), plus V*h/tp
  embedding on the first stage, 2h final norm and (pp > 1, tied) a V*h/tp embedding copy on the last.
- Pipeline: one b*s/cp/tp*h 16-bit activation per micro-batch to the next stage, the gradient back.
- Tied embedding: V*h/tp fp32 gradients all-reduced between the first and last stage.
"""

import pytest

from comet.config.parallel import Recompute, Schedule
from comet.graph.ir import GroupKind
from comet.transform import comm_volume, transform_to

from transform_helpers import base_graph, resolved

A2 = 2   # bytes of a 16-bit value


def megatron_volume(model, par, stage: int) -> dict:
    h, V, L, t, cp = model.hidden, model.vocab, model.layers, par.tp, par.cp
    T = par.micro_batch * model.seq_len // cp            # tokens per rank per micro-batch
    msg = T * h * A2
    m = par.num_microbatches
    chunks = [c * par.pp + stage for c in range(par.vpp)]
    layers = L // par.pp                                 # layers on this stage
    first, last = 0 in chunks, par.pp * par.vpp - 1 in chunks
    full = par.recompute is Recompute.FULL
    vol = {k: 0.0 for k in GroupKind}
    if t > 1:
        fwd, bwd = (4, 6) if par.sp else (2, 2)
        vol[GroupKind.TP] += layers * m * msg * (fwd + bwd + (fwd if full else 0))
        if first:
            vol[GroupKind.TP] += m * msg * (2 if par.sp else 1)
        if last:
            vol[GroupKind.TP] += m * (msg * (3 if par.sp else 1) + 3 * T * 4)
    if cp > 1:
        kv_block = T * 2 * (model.kv_hidden // t) * A2
        vol[GroupKind.CP] += layers * m * (cp - 1) * kv_block * (1 + 2 + (1 if full else 0))
    layer_params = 12 * h * h + 13 * h
    assert layer_params == model.layer_params          # GeLU MHA GPT: the SC21 count
    params = layers * layer_params / t + (V * h / t if stage == 0 else 0)
    if stage == par.pp - 1:
        params += 2 * h + (V * h / t if par.pp > 1 else 0)
    if par.dp * cp > 1:
        if not par.per_module_dp_collectives:
            vol[GroupKind.DP] += params * par.grad_reduce_bytes + (params * A2 if par.zero >= 1 else 0)
        else:      # gather before each layer's forward (and its recompute, outside PyTorch FSDP) and, ZeRO-3,
                   # backward; reduce-scatter backward in the reduce dtype (fp32 by default)
            gathers = 1 + (1 if full and not par.fsdp else 0) + (0 if par.shard_grad_op else 1)
            vol[GroupKind.DP] += layers * m * layer_params / t * (A2 * gathers + par.grad_reduce_bytes)
    p2p = T // t * h * A2
    vol[GroupKind.PP] += sum((vs != par.pp * par.vpp - 1) + (vs != 0) for vs in chunks) * m * p2p
    if par.pp > 1 and stage in (0, par.pp - 1):
        vol[GroupKind.EMBEDDING] += V * h / t * 4
    return {k: v for k, v in vol.items() if v}


TARGETS = [
    dict(tp=2), dict(tp=4, pp=2), dict(tp=8, sequence_parallel=False), dict(pp=4, dp=2),
    dict(tp=2, dp=2, cp=2), dict(pp=2, cp=2, recompute=Recompute.FULL), dict(tp=2, pp=2, dp=2, micro_batch=2),
    dict(tp=2, pp=4, vpp=2, schedule=Schedule.INTERLEAVED), dict(dp=4, zero=0), dict(dp=2, zero=3),
    dict(dp=2, zero=3, recompute=Recompute.FULL), dict(tp=4, overlap_tp_comm=True, dp=2),
    dict(dp=2, zero=3, fsdp=True, recompute=Recompute.FULL, reduce_dtype="bf16"),
    dict(dp=4, zero=2, fsdp=True, shard_grad_op=True, micro_batch=2),
    dict(tp=2, pp=2, dp=4, cp=2, recompute=Recompute.FULL, micro_batch=2),
]
BASES = [dict(), dict(tp=2, pp=2, dp=2), dict(tp=4, cp=2, recompute=Recompute.FULL)]


@pytest.mark.parametrize("base_kw", BASES, ids=["tp1", "tp2-pp2-dp2", "tp4-cp2-full"])
@pytest.mark.parametrize("target_kw", TARGETS, ids=lambda kw: "-".join(f"{k}{getattr(v, 'value', v)}"
                                                                        for k, v in kw.items()))
def test_volume_equals_megatron(small_model, h100, base_kw, target_kw):
    base = base_graph(small_model, h100, **base_kw)
    par = resolved(small_model, **target_kw)
    graph = transform_to(base, small_model, par)
    for stage in sorted({0, par.pp // 2, par.pp - 1}):
        got = {k: v for k, v in comm_volume(graph, stage).items() if v}
        want = megatron_volume(small_model, par, stage)
        assert got.keys() == want.keys(), (stage, got, want)
        for kind in want:
            assert got[kind] == pytest.approx(want[kind], rel=1e-9), (stage, kind)
