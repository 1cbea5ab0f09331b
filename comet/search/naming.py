"""Names of a design (cluster provisioning + parallel configuration) for people and for file names.

A design is a candidates-table row. `cluster_name` spells the cluster out in words and units
("1024 GPUs, NVLink 8 x 450 GB/s, scale-out 50 GB/s, expansion 512 GB @ 100 GB/s"), `parallel_name`
the layout ("tp8 pp8 dp16 mb1, selective recompute, ZeRO-1, bf16, offload optimizer"), and
`design_slug` both as a file-name-safe string. `columns` limits the cluster part to the axes that vary in
a study, so a table or a plot does not repeat what every row shares.
"""

from __future__ import annotations

import math
import re
from typing import Iterable

# (column, words before the value, unit after it); the order is the order in a name
CLUSTER_PARTS = (("hbm_GB", "HBM", " GB"), ("hbm_bandwidth_GBps", "HBM", " GB/s"),
                 ("scaleup_size", "NVLink domain", " GPUs"), ("scaleup_bandwidth_GBps", "NVLink", " GB/s"),
                 ("scaleout_bandwidth_GBps", "scale-out", " GB/s"), ("oversubscription", "oversubscription", ":1"),
                 ("compute_scale", "compute x", ""))
SLUG = {"hbm_GB": "hbm", "hbm_bandwidth_GBps": "hbmbw", "scaleup_size": "nvl", "scaleup_bandwidth_GBps": "nvlbw",
        "scaleout_bandwidth_GBps": "so", "oversubscription": "os", "compute_scale": "cx"}


def _get(row, key):
    v = row.get(key) if hasattr(row, "get") else None
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def cluster_name(row, columns: Iterable[str] | None = None) -> str:
    """The cluster of a row in words; only `columns` (plus the GPU count) when given."""
    keep = set(columns) if columns is not None else None
    parts = [f"{int(row['gpus'])} GPUs"]
    for col, words, unit in CLUSTER_PARTS:
        v = _get(row, col)
        if v is not None and (keep is None or col in keep):
            parts.append(f"{words} {_num(v)}{unit}")
    exp = _get(row, "expansion_GB")
    if exp is not None and (keep is None or keep & {"expansion_GB", "expansion_bandwidth_GBps"}):
        bw = _get(row, "expansion_bandwidth_GBps")
        parts.append("no expansion" if not exp else f"expansion {_num(exp)} GB" + (f" @ {_num(bw)} GB/s" if bw else ""))
    return ", ".join(parts)


def parallel_name(row) -> str:
    """The parallel layout of a row: tp8 pp8 dp16 mb1, selective recompute, ZeRO-1, bf16 [, offload x]."""
    dims = [f"{k}{int(row[k])}" for k in ("tp", "pp", "dp", "cp", "vpp", "ep", "etp") if _get(row, k) is not None
            and (k in ("tp", "pp", "dp") or int(row[k]) > 1)]
    if _get(row, "micro_batch") is not None:
        dims.append(f"mb{int(row['micro_batch'])}")
    parts = [" ".join(dims)]
    if _get(row, "recompute"):
        parts.append(f"{row['recompute']} recompute" if row["recompute"] != "none" else "no recompute")
    if _get(row, "zero") is not None:
        parts.append(f"ZeRO-{int(row['zero'])}")
    if _get(row, "precision"):
        parts.append(str(row["precision"]))
    off = _get(row, "offload")
    if off and off != "none":
        parts.append(f"offload {off.replace('+', ' + ')}")
    if _get(row, "moe_dispatcher") not in (None, "alltoall"):     # MoE knobs away from their defaults
        parts.append(f"{row['moe_dispatcher']} dispatch")
    if _get(row, "moe_capacity_factor") is not None:
        parts.append(f"capacity {row['moe_capacity_factor']:g}")
    if _get(row, "moe_imbalance") not in (None, 1.0):
        parts.append(f"imbalance {row['moe_imbalance']:g}")
    if _get(row, "moe_overlap_a2a"):
        parts.append("a2a overlap")
    return ", ".join(parts)


def design_name(row, columns: Iterable[str] | None = None) -> str:
    return f"{cluster_name(row, columns)} | {parallel_name(row)}"


def design_slug(row, columns: Iterable[str] | None = None) -> str:
    """File-name-safe design: 1024gpu_nvl8_so50_exp512at100_tp8-pp8-dp16-mb1-selective-z1-bf16; the
    cluster part limited to `columns` (the axes a study varies) when given."""
    keep = set(columns) if columns is not None else None
    parts = [f"{int(row['gpus'])}gpu"]
    for col, short in SLUG.items():
        v = _get(row, col)
        if v is not None and (keep is None or col in keep):
            parts.append(f"{short}{_num(v)}")
    exp = _get(row, "expansion_GB")
    if exp and (keep is None or "expansion_GB" in keep):
        bw = _get(row, "expansion_bandwidth_GBps")
        parts.append(f"exp{_num(exp)}" + (f"at{_num(bw)}" if bw else ""))
    parts.append(str(row.get("label") or ""))
    off = _get(row, "offload")
    if off and off != "none":
        parts.append(f"off-{off}")
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", "_".join(p for p in parts if p))
