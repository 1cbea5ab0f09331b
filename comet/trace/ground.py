"""Ground comet's base StepGraph in a recognised trace, op by op (Lumos, Liang et al., MLSys 2025: keep
the measured duration of every op, re-time only what a transformation changes).

    rec = recognize(paths)
    base, report = ground(rec, cluster)          # cluster: the hardware the trace was measured on
    evaluate(model_b, cluster, par_b, base=base)  # any other configuration: transform_to + replay

1. The model and configuration the trace ran (`model_of`, `parallel_of`) are built by comet's builder
   (comet/workload/builder.py) and timed by the cost model on `cluster` (materialize).
2. Every op whose role the trace measured (Recognition.role_ms, comet/trace/roles.py) takes the measured
   time: **measured**.
3. Every other op gets the cost model's time times the factor of its class (gemm, attention, memory,
   communication) = measured / modelled summed over the measured ops of that class: **modelled**
   (a backward in a forward-only trace, the optimizer of a trace without one). A class with no measured
   op keeps factor 1, and the report says so.
4. Host time no role covers (Python and dispatch between ops; a CPU-only trace only, where it is on the
   critical path) becomes one `host.*` op per block (layer forward, layer backward, the rest of the step
   after the head's backward). These ops have no shape: transformations keep them as they are.

The report lists every op with its source; `transform_to` then carries each measured duration to a
candidate by the cost-model ratio of its new shape (comet/transform/retime.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import networkx as nx

from comet.config.cluster import ClusterSpec
from comet.config.model import ModelSpec
from comet.config.parallel import ParallelConfig, Precision
from comet.errors import TraceError
from comet.graph.ir import COMPUTE_STREAM, KernelClass, Op, OpKind, Phase, StepGraph
from comet.replay.timing import op_time_s
from comet.trace.recognize import Recognition
from comet.transform.materialize import map_ops, materialize
from comet.workload.builder import build_step_graph

_PRECISION = {"fp16": Precision.FP16, "bf16": Precision.BF16, "fp8": Precision.FP8,
              # comet has no fp32 training precision: an fp32 trace (the CPU recorder) runs in the 16-bit
              # slot of a cluster spec whose peaks are the fp32 ones (cluster_specs/vm_cpu_gloo.yaml)
              "fp32": Precision.BF16}


def _klass(op: Op) -> str | None:
    if op.is_comm:
        return "communication"
    return {KernelClass.GEMM: "gemm", KernelClass.ATTENTION: "attention",
            KernelClass.MEMORY: "memory"}.get(op.kernel)


@dataclass
class GroundingReport:
    ops: list = field(default_factory=list)          # (block, op, "measured" | "modelled", seconds)
    factors: dict = field(default_factory=dict)      # class -> measured / modelled
    notes: list = field(default_factory=list)

    def counts(self) -> dict:
        out = {"measured": 0, "modelled": 0, "host": 0}
        for _, _, src, _ in self.ops:
            out[src] += 1
        return out

    def line(self) -> str:
        c = self.counts()
        f = ", ".join(f"{k} x{v:.3f}" for k, v in sorted(self.factors.items()))
        return (f"grounded base: {c['measured']} ops measured, {c['modelled']} modelled (class factors: {f or 'none'})"
                + (f", {c['host']} host ops" if c["host"] else ""))


def model_of(rec: Recognition, tied_embeddings: bool | None = None) -> ModelSpec:
    missing = [k for k in ("layers", "hidden", "heads", "ffn_hidden", "seq_len", "micro_batch", "vocab", "tp")
               if getattr(rec, k) is None]
    if missing:
        why = "; ".join(f"{k}: {v}" for k, v in rec.unrecognised.items()) or "not found"
        raise TraceError(f"cannot ground a base in this trace: {', '.join(missing)} not recognised ({why})",
                         path=rec.source)
    # Tying is not visible in a trace of one step: GPT (GeLU) ties, Llama-style (SwiGLU) does not.
    tied = (rec.activation != "swiglu") if tied_embeddings is None else tied_embeddings
    return ModelSpec(name=f"trace:{rec.source}", layers=rec.layers, hidden=rec.hidden, heads=rec.heads,
                     kv_heads=rec.kv_heads, ffn_hidden=rec.ffn_hidden, activation=rec.activation,
                     vocab=rec.vocab, seq_len=rec.seq_len, tied_embeddings=tied, source="recognised from a trace")


def parallel_of(rec: Recognition, model: ModelSpec, **overrides) -> ParallelConfig:
    """The configuration the trace ran: one micro-batch per step (a trace holds one), no sequence
    parallelism, no ZeRO, gradients reduced after the backward, flash attention unless the trace ran
    the unfused baddbmm + softmax + bmm attention."""
    unfused = "attention.qk" in rec.role_ms
    fields = dict(tp=rec.tp, pp=1, dp=rec.dp or 1, micro_batch=rec.micro_batch,
                  global_batch=rec.micro_batch * (rec.dp or 1), sequence_parallel=False, zero=0,
                  precision=_PRECISION.get(rec.dtype or "bf16", Precision.BF16), overlap_grad_reduce=False,
                  overlap_param_gather=False, flash_attention=not unfused)
    fields.update(overrides)
    return ParallelConfig(**fields).resolve(model)


def ground(rec: Recognition, cluster: ClusterSpec, *, scale: float = 1.0, model: ModelSpec | None = None,
           par: ParallelConfig | None = None) -> tuple[StepGraph, GroundingReport]:
    """The base StepGraph of the recognised configuration with the trace's measured op times.
    `scale` multiplies every measured time (e.g. unprofiled / profiled step time of the same run)."""
    model = model or model_of(rec)
    par = par or parallel_of(rec, model)
    built = materialize(build_step_graph(model, par), cluster)
    prec = par.precision.value
    measured = {k: v * 1e-3 * scale for k, v in rec.role_ms.items()}
    report = GroundingReport()
    # class factors from the ops the trace measured
    meas, mod = {}, {}
    for g in built.blocks.values():
        for _, op in g.nodes(data="op"):
            k = _klass(op)
            if op.name in measured and k:
                meas[k] = meas.get(k, 0.0) + measured[op.name]
                mod[k] = mod.get(k, 0.0) + op_time_s(op, cluster, prec)
    report.factors = {k: meas[k] / mod[k] for k in meas if mod[k] > 0}
    for k in ("gemm", "attention", "memory", "communication"):
        if k not in report.factors:
            report.notes.append(f"{k}: no measured op in the trace, factor 1")

    def timed(block: str, op: Op) -> Op:
        if op.name in measured:
            report.ops.append((block, op.name, "measured", measured[op.name]))
            return op.with_(duration_s=measured[op.name])
        d = op_time_s(op, cluster, prec) * report.factors.get(_klass(op), 1.0)
        report.ops.append((block, op.name, "modelled", d))
        return op.with_(duration_s=d)

    grounded = map_ops(built, timed)
    blocks = grounded.blocks
    host = rec.unattributed_ms if rec.streams.get("cpu threads") else {}
    for key, what, per in (("layer.fwd", "layer forward", rec.layers), ("layer.bwd", "backward", rec.layers),
                           ("head.bwd", "other", 1)):
        s = host.get(what, 0.0) * 1e-3 * scale / per
        if s > 0 and key in blocks:
            _append_host(blocks[key], f"host.{what.replace(' ', '_')}", s, key)
            report.ops.append((key, f"host.{what.replace(' ', '_')}", "host", s))
    meta = dict(built.meta, source="trace", trace=rec.source, grounding=report)
    return grounded.with_(meta=meta), report


def _append_host(g: nx.DiGraph, name: str, seconds: float, block: str) -> None:
    """A shapeless compute op at the end of the block on the compute stream (host time on a CPU run)."""
    sinks = [n for n in g.nodes if g.out_degree(n) == 0 and g.nodes[n]["op"].stream == COMPUTE_STREAM]
    nid = ("host", name)
    phase = Phase.BACKWARD if block.endswith("bwd") else Phase.FORWARD
    g.add_node(nid, op=Op(name, OpKind.COMPUTE, kernel=KernelClass.OTHER, duration_s=seconds, phase=phase))
    for u in sinks:
        g.add_edge(u, nid, dep="data")


_DIMS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab")


def ground_for(paths, model: ModelSpec, cluster: ClusterSpec, step=None) -> tuple[StepGraph, GroundingReport]:
    """A study's base from a trace: the study's model with the trace's dimensions (transformations then
    carry it to the study's own dimensions, op by op), in the configuration the trace ran, grounded in
    its measured ops. TraceError when the trace is not a recognisable LLM step."""
    from comet.trace.recognize import recognize
    rec = recognize(paths, step=step)
    own = model_of(rec, tied_embeddings=model.tied_embeddings)
    traced = replace(model, **{k: getattr(own, k) for k in _DIMS})
    base, report = ground(rec, cluster, model=traced, par=parallel_of(rec, traced))
    if traced.activation.value != (rec.activation or traced.activation.value):
        report.notes.append(f"the trace's activation is {rec.activation}, the model's {traced.activation.value}: "
                            "the activation ops are modelled")
    return base, report
