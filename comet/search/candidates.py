"""Candidates of a study: grid enumeration, random sampling and Optuna ask/tell, with cheap pruning
(max GPUs, divisibility via ParallelConfig.resolve, capex budget, memory fit via precheck) before any
replay, and counts of pruned candidates by reason."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from comet import cost
from comet.errors import ConfigError
from comet.search.context import (Candidate, EvalContext, candidate_key, canonical_provision, provisioned,
                                  parallel_from_params)
from comet.search.space import Axis, Range, SearchSpace

# Provisioning keys that memory fit can depend on (precheck results are shared across the others).
_MEMORY_KEYS = ("hbm_GB", "expansion_GB", "expansion_bandwidth_GBps")


@dataclass(frozen=True)
class Pruned:
    """A candidate rejected before replay: `category` groups the counts, `reason` is the full message."""
    category: str
    reason: str
    params: tuple[tuple[str, Any], ...] = ()


@dataclass
class PruneStats:
    proposed: int = 0
    duplicates: int = 0
    by_category: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)

    def add(self, pruned: Pruned) -> None:
        self.by_category[pruned.category] += 1
        self.examples.setdefault(pruned.category, pruned.reason)

    @property
    def pruned(self) -> int:
        return sum(self.by_category.values())


def _precheck_fn(ctx: EvalContext):
    if ctx.precheck_fn is not None:
        return ctx.precheck_fn
    from comet.evaluate import precheck
    return precheck


def memory_category(reason: str) -> str:
    """Group precheck reasons (it checks rules, then memory fit; see comet/workload/memory.py)."""
    text = reason.lower()
    if "needs a memory expansion tier" in text:
        return "offload without expansion tier"
    if "but it holds" in text:
        return "memory (expansion capacity)"
    if "hbm" in text or "memory" in text or " gb" in text:
        return "memory (HBM)"
    return "rule precheck"


class CandidateFactory:
    """Turns axis values into a Candidate or a Pruned, cheapest check first, with memoized rules."""

    def __init__(self, space: SearchSpace, ctx: EvalContext, fingerprint: str):
        self.space, self.ctx, self.fingerprint = space, ctx, fingerprint
        self.stats = PruneStats()
        self._seen: set[str] = set()
        self._resolved: dict = {}
        self._prechecked: dict = {}
        self._precheck = _precheck_fn(ctx) if space.constraints.memory_fit else None
        self._sections: dict[tuple, list] = {}   # axis names -> [("cluster", "hbm_GB"), ...]

    def make(self, values: dict[str, Any], number: int) -> Candidate | Pruned:
        self.stats.proposed += 1
        params = tuple(values.items())
        out = self._make(values, number, params)
        if isinstance(out, Pruned):
            self.stats.add(out)
        return out

    def is_new(self, cand: Candidate) -> bool:
        """False (and counted) for a candidate already made: same key, e.g. any bandwidth of no expansion."""
        if cand.key in self._seen:
            self.stats.duplicates += 1
            return False
        self._seen.add(cand.key)
        return True

    def _make(self, values: dict, number: int, params: tuple) -> Candidate | Pruned:
        names = tuple(values)
        sections = self._sections.get(names)
        if sections is None:    # perf: the axis names are split once per study, not once per candidate
            sections = self._sections[names] = [_section(name) for name in names]
        prov: dict = {}
        par: dict = {}
        for (section, short), v in zip(sections, values.values()):
            if section == "cluster":
                prov[short] = v
            elif section == "parallel":
                par[short] = v
        gpus = prov.pop("gpus", None)
        if par.get("schedule") == "interleaved_1f1b" and par.get("vpp", 1) == 1:
            par["schedule"] = "1f1b"   # one virtual stage: Megatron runs the plain 1F1B schedule
        parallel = self._resolve(par, gpus)
        if isinstance(parallel, Pruned):
            return Pruned(parallel.category, parallel.reason, params)
        c = self.space.constraints
        if c.max_gpus is not None and parallel.gpus > c.max_gpus:
            return Pruned("constraint max_gpus", f"{parallel.gpus} GPUs > max_gpus {c.max_gpus}", params)
        size = prov.get("scaleup_size")
        if size is not None and parallel.gpus % size and parallel.gpus > size:
            return Pruned("rule scaleup_size", f"gpus ({parallel.gpus}) must be a multiple of the scale-up "
                          f"domain size ({size})", params)
        provision = canonical_provision(prov)
        key = candidate_key(self.fingerprint, parallel, provision)
        cluster = provisioned(self.ctx.cluster, provision)
        if c.max_capex_usd is not None:
            capex = cost.capex_usd(cluster, parallel.gpus, self.ctx.gpus_per_chassis)
            if capex > c.max_capex_usd:
                return Pruned("constraint max_capex_usd", f"capex {capex:,.0f} USD > {c.max_capex_usd:,.0f}", params)
        if c.max_power_kW is not None:   # even all GPUs at their idle draw exceed the cap: no replay can help
            floor_kW = cost.power_floor_W(cluster, parallel.gpus, self.ctx.gpus_per_chassis) / 1000.0
            if floor_kW > c.max_power_kW:
                return Pruned("constraint max_power_kW", f"power at least {floor_kW:,.1f} kW (GPUs at idle draw) "
                              f"> max_power_kW {c.max_power_kW:,.1f}", params)
        if self._precheck is not None:
            mem_key = (parallel, tuple(kv for kv in provision if kv[0] in _MEMORY_KEYS))
            if mem_key not in self._prechecked:
                self._prechecked[mem_key] = self._precheck(self.ctx.model, cluster, parallel)
            ok, reason = self._prechecked[mem_key]
            if not ok:
                return Pruned(memory_category(reason), reason, params)
        return Candidate(key=key, parallel=parallel, provision=provision, number=number, params=params)

    def _resolve(self, par: dict, gpus: int | None):
        memo = (tuple(par.items()), gpus)
        if memo not in self._resolved:
            try:
                cfg = parallel_from_params(par, self.space.global_batch, gpus)
                self._resolved[memo] = cfg.resolve(self.ctx.model)
            except ConfigError as exc:
                self._resolved[memo] = Pruned(f"rule {exc.field or 'parallel'}", str(exc))
        return self._resolved[memo]


def _section(name: str) -> tuple[str, str]:
    """("cluster", "hbm_GB") of "cluster.hbm_GB"; ("", name) for a name outside both sections."""
    section, dot, short = name.partition(".")
    return (section, short) if dot and section in ("cluster", "parallel") else ("", name)


# ----------------------------------------------------------------------------- proposal methods

def grid_values(space: SearchSpace) -> Iterator[dict[str, Any]]:
    """Every combination of the grid axes, provisioning outermost (so resolve/precheck memos hit)."""
    names = [a.name for a in space.axes]
    for combo in itertools.product(*(a.values for a in space.axes)):
        yield dict(zip(names, combo))


def grid(space: SearchSpace, factory: CandidateFactory) -> Iterator[Candidate]:
    bw_axis = next((a for a in space.provision if a.short == "expansion_bandwidth_GBps"), None)
    first_bw = bw_axis.values[0] if bw_axis else None
    sched_axis = next((a for a in space.parallel if a.short == "schedule"), None)
    plain_in_grid = sched_axis is not None and "1f1b" in sched_axis.values
    for number, values in enumerate(grid_values(space)):
        repeat = values.get("cluster.expansion_GB") == 0 and bw_axis and values[bw_axis.name] != first_bw
        # interleaved 1F1B with one virtual stage is the plain 1F1B point of the same grid
        repeat = repeat or (plain_in_grid and values.get("parallel.schedule") == "interleaved_1f1b"
                            and values.get("parallel.vpp", 1) == 1)
        if repeat:
            factory.stats.proposed += 1
            factory.stats.duplicates += 1
            continue
        out = factory.make(values, number)
        if isinstance(out, Candidate) and factory.is_new(out):
            yield out


def sample_axis(axis: Axis, rng: np.random.Generator) -> Any:
    if axis.is_grid:
        return axis.values[int(rng.integers(len(axis.values)))]
    r: Range = axis.range
    if r.log:
        x = math.exp(rng.uniform(math.log(r.low), math.log(r.high)))
    else:
        x = rng.uniform(r.low, r.high)
    if r.step:
        x = r.low + round((x - r.low) / r.step) * r.step
    x = min(max(x, r.low), r.high)
    return int(round(x)) if r.integer else float(x)


def random_candidates(space: SearchSpace, factory: CandidateFactory, seed: int) -> Iterator[Candidate]:
    """Uniform samples (log-uniform for log ranges) until the space runs dry: duplicates and pruned
    samples are skipped; the caller stops at its trial budget. Stops after 2000 misses in a row."""
    rng = np.random.default_rng(seed)
    misses, number = 0, 0
    while misses < 2000:
        values = {a.name: sample_axis(a, rng) for a in space.axes}
        out = factory.make(values, number)
        number += 1
        if isinstance(out, Candidate) and factory.is_new(out):
            misses = 0
            yield out
        else:
            misses += 1
