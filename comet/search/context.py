"""What a worker needs to evaluate a candidate: the shared context, the candidate, and the pure
function that applies provisioning, calls comet.evaluate and adds cost. No Ray here."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path
import json
import traceback
from dataclasses import dataclass, replace
from typing import Any, Callable

from comet import cost
from comet.config.cluster import ClusterSpec, MemoryTier
from comet.config.job import JobSpec
from comet.config.model import ModelSpec
from comet.config.moe import Dispatcher
from comet.config.parallel import (OffloadTarget, ParallelConfig, Precision, Recompute, RecomputeModule, Schedule,
                                   SelectivePolicy)
from comet.errors import ConfigError
from comet.result import CandidateStatus, Result

# Canonical order of provisioning keys (columns, labels, keys).
PROVISION_KEYS = ("hbm_GB", "hbm_bandwidth_GBps", "expansion_GB", "expansion_bandwidth_GBps", "scaleup_size",
                  "scaleup_bandwidth_GBps", "scaleout_bandwidth_GBps", "oversubscription", "compute_scale")
# every enum-typed field: the rules and models compare members by identity (`is`), so a value left a
# string would be evaluated as another configuration, while comparing and hashing equal to the member
_ENUMS = {"schedule": Schedule, "recompute": Recompute, "selective_policy": SelectivePolicy, "precision": Precision,
          "moe_dispatcher": Dispatcher}


@dataclass(frozen=True)
class EvalContext:
    """Inputs shared by every candidate of a study: put into Ray's object store once."""
    model: ModelSpec
    cluster: ClusterSpec             # the base cluster spec, before provisioning
    job: JobSpec
    base: Any = None                 # StepGraph of the study's base trace, or None
    evaluate_fn: Callable | None = None   # None: comet.evaluate.evaluate (tests inject a fake)
    precheck_fn: Callable | None = None   # None: comet.evaluate.precheck
    fingerprint: str = ""            # of the study (driver.build_context): in every journal record

    @property
    def gpus_per_chassis(self) -> int:
        return self.cluster.gpus_per_node


@dataclass(frozen=True)
class Candidate:
    key: str                         # hash of the resolved configuration (resume identity)
    parallel: ParallelConfig         # resolved when its rules hold
    provision: tuple[tuple[str, Any], ...]
    number: int = 0                  # generation order, for deterministic output
    params: tuple[tuple[str, Any], ...] = ()   # the raw axis values (Optuna params, CSV columns)

    @property
    def provision_dict(self) -> dict:
        return dict(self.provision)


def canonical_provision(values: dict) -> tuple[tuple[str, Any], ...]:
    """Provisioning in canonical order; the bandwidth of an absent expansion tier is dropped, so
    `expansion_GB: 0` at any bandwidth is one candidate."""
    prov = {k: values[k] for k in PROVISION_KEYS if k in values}
    if prov.get("expansion_GB") == 0:
        prov.pop("expansion_bandwidth_GBps", None)
    return tuple(prov.items())


def apply_provisioning(cluster: ClusterSpec, provision: dict) -> ClusterSpec:
    """The base cluster with the provisioning axes applied (dataclasses.replace, nothing mutated)."""
    gpu = cluster.gpu
    if "hbm_GB" in provision:
        gpu = replace(gpu, hbm_GB=provision["hbm_GB"])
    if "hbm_bandwidth_GBps" in provision:
        gpu = replace(gpu, hbm_bandwidth_GBps=provision["hbm_bandwidth_GBps"])
    if "compute_scale" in provision:
        s = provision["compute_scale"]
        gpu = replace(gpu, peak_tflops={k: v * s for k, v in gpu.peak_tflops.items()})
    network = list(cluster.network)
    up = {k: provision[p] for k, p in (("size", "scaleup_size"), ("bandwidth_GBps", "scaleup_bandwidth_GBps"))
          if p in provision}
    out = {k: provision[p] for k, p in (("bandwidth_GBps", "scaleout_bandwidth_GBps"),
                                        ("oversubscription", "oversubscription")) if p in provision}
    if (up or out) and len(network) < 2:
        raise ConfigError(f"scale-up / scale-out axes need a cluster with two network dimensions, "
                          f"{cluster.name} has {len(network)}", field="cluster")
    if up:
        network[0] = replace(network[0], **up)
    if out:
        network[-1] = replace(network[-1], **out)
    expansion = cluster.memory_expansion
    if "expansion_GB" in provision or "expansion_bandwidth_GBps" in provision:
        capacity = provision.get("expansion_GB", expansion.capacity_GB if expansion else 0.0)
        if capacity == 0:
            expansion = None
        else:
            bandwidth = provision.get("expansion_bandwidth_GBps", expansion.bandwidth_GBps if expansion else None)
            if bandwidth is None:
                raise ConfigError(f"{cluster.name} has no memory expansion tier: give expansion_bandwidth_GBps",
                                  field="cluster.expansion_bandwidth_GBps")
            expansion = MemoryTier(name=expansion.name if expansion else "expansion", capacity_GB=capacity,
                                   bandwidth_GBps=bandwidth)
    return replace(cluster, gpu=gpu, network=tuple(network), memory_expansion=expansion)


def cluster_axes(cluster: ClusterSpec) -> dict:
    """Every provisioning axis' value in `cluster` (the inverse of apply_provisioning), so a results row
    carries its complete cluster whether an axis was swept or not."""
    exp = cluster.memory_expansion
    axes = {"hbm_GB": cluster.gpu.hbm_GB, "hbm_bandwidth_GBps": cluster.gpu.hbm_bandwidth_GBps,
            "expansion_GB": exp.capacity_GB if exp else 0.0,
            "expansion_bandwidth_GBps": exp.bandwidth_GBps if exp else None,
            "scaleup_size": cluster.network[0].size, "scaleup_bandwidth_GBps": cluster.network[0].bandwidth_GBps,
            "compute_scale": 1.0}
    if len(cluster.network) > 1:
        axes["scaleout_bandwidth_GBps"] = cluster.network[-1].bandwidth_GBps
        axes["oversubscription"] = cluster.network[-1].oversubscription
    return axes


def parallel_from_params(params: dict, global_batch: int, gpus: int | None) -> ParallelConfig:
    """ParallelConfig from canonical axis values (enum names as strings, offload as 'a+b' / 'none')."""
    kwargs = {"global_batch": global_batch, "gpus": gpus}
    for name, value in params.items():
        if name in _ENUMS:
            value = _ENUMS[name](value)
        elif name == "offload":
            value = () if value == "none" else tuple(OffloadTarget(t) for t in value.split("+"))
        elif name == "recompute_modules":
            value = tuple(RecomputeModule(m) for m in value)
        kwargs[name] = value
    return ParallelConfig(**kwargs)


def parallel_dict(parallel: ParallelConfig) -> dict:
    """The configuration's fields, enums as their values and offload as 'a+b' / 'none' (a fresh dict)."""
    return dict(_parallel_forms(parallel)[1])


def _parallel_dict(parallel: ParallelConfig) -> dict:
    # perf: the fields are scalars, enums and a tuple of enums: a shallow copy is what asdict() gives
    d = {f.name: getattr(parallel, f.name) for f in dataclasses.fields(parallel)}
    for k, v in d.items():
        if isinstance(v, (Schedule, Recompute, Precision, Dispatcher)):
            d[k] = v.value
    d["offload"] = "+".join(t.value for t in parallel.offload) or "none"
    return d


_parallel_memo: dict = {}


def _parallel_forms(parallel: ParallelConfig) -> tuple[ParallelConfig, dict, str]:
    """(parallel, its dict, its sorted JSON), one entry per configuration object: a study's thousands of
    candidates share a few dozen resolved configurations (CandidateFactory memoizes them), so the dict
    and the key's JSON are built once per configuration, not per candidate."""
    hit = _parallel_memo.get(id(parallel))
    if hit is None or hit[0] is not parallel:
        if len(_parallel_memo) >= 4096:
            _parallel_memo.clear()
        d = _parallel_dict(parallel)
        hit = _parallel_memo[id(parallel)] = (parallel, d, json.dumps(d, sort_keys=True, default=str))
    return hit


@functools.lru_cache(maxsize=4096)
def _provision_json(provision: tuple) -> str:
    return json.dumps(list(provision), sort_keys=True, default=str)


def candidate_key(fingerprint: str, parallel: ParallelConfig, provision: tuple) -> str:
    # the text of json.dumps({"ctx": ..., "parallel": ..., "provision": ...}, sort_keys=True, default=str),
    # assembled from the configuration's memoized JSON and the provisioning's, memoized too: a study has a
    # few dozen of each (test_candidates pins the equality)
    blob = (f'{{"ctx": {json.dumps(fingerprint)}, "parallel": {_parallel_forms(parallel)[2]}, '
            f'"provision": {_provision_json(provision)}}}')
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def engine_fingerprint() -> str:
    """Hash of comet's own code and data files: results of an earlier engine are not resumed."""
    import comet
    root = Path(comet.__file__).parent
    h = hashlib.sha1(comet.__version__.encode())
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".yaml"):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def context_fingerprint(ctx_parts: dict) -> str:
    """Hash of everything shared by the study (model, base cluster, job, base trace, cost overrides)."""
    return hashlib.sha1(json.dumps(ctx_parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cluster_for(ctx: EvalContext, cand: Candidate) -> ClusterSpec:
    return provisioned(ctx.cluster, cand.provision)


_provisioned: dict = {}


def provisioned(cluster: ClusterSpec, provision: tuple) -> ClusterSpec:
    """apply_provisioning, one object per (base cluster, provisioning) in this process: the candidates
    of a study share a few dozen clusters, and the replay's caches key a cluster object once."""
    key = (id(cluster), provision)
    hit = _provisioned.get(key)
    if hit is None or hit[0] is not cluster:
        if len(_provisioned) >= 1024:
            _provisioned.clear()
        hit = _provisioned[key] = (cluster, apply_provisioning(cluster, dict(provision)))
    return hit[1]


def _evaluate_fn(ctx: EvalContext) -> Callable:
    if ctx.evaluate_fn is not None:
        return ctx.evaluate_fn
    from comet.evaluate import evaluate  # imported in the worker; comet.evaluate knows nothing of Ray
    return evaluate


def evaluate_candidate(ctx: EvalContext, cand: Candidate, timeline: bool = False) -> Result:
    """Evaluate one candidate; an exception inside evaluate() becomes status ERROR, never a crash."""
    try:
        cluster = cluster_for(ctx, cand)
        res = _evaluate_fn(ctx)(ctx.model, cluster, cand.parallel, ctx.job, timeline=timeline, base=ctx.base)
    except Exception as exc:  # noqa: BLE001 - a bug in one candidate must not stop the study
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
        return Result(status=CandidateStatus.ERROR, reason=f"{type(exc).__name__}: {exc}{where}",
                      label=cand.parallel.label() if cand.parallel.dp else "", gpus=cand.parallel.gpus or 0)
    gpus = res.gpus or cand.parallel.gpus or 0
    if res.feasible:
        res.extra.update(cost.run_costs(res.tokens_per_s, cluster, gpus, ctx.job, ctx.gpus_per_chassis,
                                        cost.utilisation(res.breakdown, res.step_time_s)))
    else:  # no run to cost, but the cluster still has a price
        res.extra.update(capex_usd=cost.capex_usd(cluster, gpus, ctx.gpus_per_chassis),
                         power_kW=cost.power_W(cluster, gpus, ctx.gpus_per_chassis) / 1000.0)
    return res


def evaluate_chunk(ctx: EvalContext, chunk: list[Candidate]) -> list[tuple[str, Result]]:
    """The unit of work of an executor: a few candidates, evaluated in order."""
    return [(c.key, evaluate_candidate(ctx, c)) for c in chunk]
