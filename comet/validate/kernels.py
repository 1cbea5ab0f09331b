"""Kernel- and NCCL-level validation: `comet validate` on calibration/collectives.csv, gemm.csv,
attention.csv or memory.csv (told apart by their header) predicts every row with comet's cost models
(comet/hardware/network.py, compute.py) on the cluster spec of the system the row was measured on, and
reports the error per row, per collective / kernel, per scale and per source.

Nothing is fitted to these rows: the prediction uses the spec's datasheet peaks and its efficiency
parameters as they stand. A row comet cannot express (no spec for its GPU, a size label that is not a
byte count, a kernel comet has no model of) is reported as skipped with the reason.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path

from comet.config.cluster import ClusterSpec, CollectiveAlgorithm, load_cluster
from comet.config.document import read_text
from comet.errors import ConfigError
from comet.graph.ir import Collective
from comet.hardware.compute import attention_time_s, gemm_time_s, memory_time_s
from comet.hardware.network import chosen_algorithm, p2p_time_s

# (GPU name fragment, scale-out fabric) -> cluster spec of that system; "*" = any fabric.
SPEC_FOR = {("H100", "roce-400g"): "h100_roce", ("H100", "gcp-tcpxo"): "h100_a3mega",
            ("H100", "*"): "h100_dgx", ("H200", "*"): "h200_dgx", ("A100", "*"): "a100_dgx",
            ("H800", "*"): "h800_hgx"}
COLLECTIVES = {"all_reduce": Collective.ALL_REDUCE, "all_gather": Collective.ALL_GATHER,
               "reduce_scatter": Collective.REDUCE_SCATTER, "alltoall": Collective.ALL_TO_ALL}
# nccl-tests bus bandwidth = algbw * factor(n) (nccl-tests doc/PERFORMANCE.md)
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
              "sendrecv": lambda n: 1.0}
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


@dataclass
class KernelRow:
    index: int
    source: str
    kind: str            # collective or kernel class
    scale: str           # "8 GPUs x 1 node", "bf16 8192x8192x8192", ...
    measured_s: float
    predicted_s: float = math.nan
    detail: str = ""     # algorithm chosen, spec used
    skip: str = ""

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_s - self.measured_s) / self.measured_s if not self.skip else math.nan

    def as_dict(self) -> dict:
        def num(x: float) -> float | None:   # NaN (not measured / not predicted) is null: strict JSON
            return x if math.isfinite(x) else None
        return {"row": self.index, "source": self.source, "kind": self.kind, "scale": self.scale,
                "measured_s": num(self.measured_s), "predicted_s": num(self.predicted_s),
                "error_pct": num(self.error_pct), "detail": self.detail, "skipped": self.skip}


def file_kind(header: list[str]) -> str | None:
    """Which kernel-level file a CSV header belongs to (None: a training-measurement file)."""
    h = set(header)
    if {"collective", "busbw_GBps", "size_bytes"} <= h:
        return "collectives"
    if {"m", "n", "k", "tflops"} <= h:
        return "gemm"
    if {"seq_q", "head_dim", "direction"} <= h:
        return "attention"
    if {"kernel", "bytes", "GBps"} <= h:
        return "memory"
    return None


def kernel_level(path: Path) -> bool:
    text = read_text(path, "CSV")    # the input gate (comet/config/document.py): binary, gzip, UTF-8, size
    return file_kind(next(csv.reader(io.StringIO(text, newline="")), [])) is not None


class Specs:
    def __init__(self, folder: Path):
        self.folder, self.cache = folder, {}

    def for_gpu(self, gpu: str, fabric: str = "*") -> tuple[str, ClusterSpec] | None:
        name = gpu.upper()
        for (frag, fab), spec in SPEC_FOR.items():
            if frag in name and fab in (fabric, "*") and (self.folder / f"{spec}.yaml").is_file():
                if spec not in self.cache:
                    self.cache[spec] = load_cluster(self.folder / f"{spec}.yaml")
                return spec, self.cache[spec]
        return None


def _float(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def _int(text: str) -> int:
    x = _float(text)
    return int(x) if math.isfinite(x) else 0


def size_bytes(text: str) -> float:
    """'1073741824', or a label of a power-of-two sweep as Azure prints it ('65K' = 65536, '8G'): a
    label with a unit is the nearest power of two (MICROBENCH.md: the sweep is -b 8 -f 2)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)B?\s*", text or "")
    if not m:
        return math.nan
    value = float(m.group(1)) * UNITS[m.group(2)]
    return float(2 ** round(math.log2(value))) if m.group(2) and value > 0 else value


def forced_algorithm(row: dict) -> CollectiveAlgorithm | None:
    """NCCL_ALGO in the row's settings (or its algo column) restricts the choice as NCCL does."""
    m = re.search(r"NCCL_ALGO=(\w+)", row.get("settings", ""))
    name = (m.group(1) if m else row.get("algo", "")).lower()
    return {"ring": CollectiveAlgorithm.RING, "nvls": CollectiveAlgorithm.NVLS,
            "tree": CollectiveAlgorithm.TREE}.get(name)


def _restrict(cluster: ClusterSpec, algo: CollectiveAlgorithm | None) -> ClusterSpec:
    if algo is None:
        return cluster
    from dataclasses import replace
    return replace(cluster, network=tuple(replace(d, algorithm=algo) for d in cluster.network))


def predict_collective(i: int, row: dict, specs: Specs) -> KernelRow:
    coll, n = row.get("collective", ""), _int(row.get("num_gpus"))
    gpn = (_int(row.get("gpus_per_node")) or n)
    nbytes = size_bytes(row.get("size_bytes", ""))
    t_us, busbw = _float(row.get("time_us")), _float(row.get("busbw_GBps"))
    measured = t_us * 1e-6
    if math.isnan(measured) and coll in BUS_FACTOR and busbw > 0 and nbytes > 0:
        measured = nbytes * BUS_FACTOR[coll](n) / (busbw * 1e9)   # only busbw printed: time it implies
    nodes = max(1, n // max(1, gpn))
    out = KernelRow(i, row.get("source", ""), coll, f"{n} GPUs = {nodes} x {gpn}", measured)
    found = specs.for_gpu(row.get("gpu", ""), row.get("scaleout", ""))
    if n < 1:
        out.skip = "num_gpus not given"
        return out
    if found is None:
        out.skip = f"no cluster spec for GPU {row.get('gpu', '')!r}"
    elif "FLAG" in row.get("notes", ""):
        out.skip = "the source flags the measurement as suspect (notes: FLAG); reported, not scored"
    elif not nbytes > 0 or not measured > 0:
        out.skip = "no byte size or no time / bus bandwidth in the row"
    elif coll not in COLLECTIVES and coll != "sendrecv":
        out.skip = f"collective {coll!r} not modelled"
    if out.skip:
        return out
    spec_name, cluster = found
    node = cluster.network[0].size or gpn
    if gpn > node or node % gpn:
        out.skip = f"{gpn} GPUs per node does not fit {spec_name}'s {node}-GPU domain"
        return out
    stride = node // gpn        # G of the node's GPUs in use: one in every node/G, each with its own NIC
    cluster = _restrict(cluster, forced_algorithm(row))
    if coll == "sendrecv":
        # nccl-tests sendrecv: rank r sends to r+1; the slowest pair sets the time (a node boundary if
        # any), on NCCL's channels per network peer for a communicator of n ranks, gpn per node
        distance = node if nodes > 1 else stride
        out.predicted_s, out.detail = p2p_time_s(nbytes, distance, cluster, n, gpn), f"{spec_name} p2p"
        return out
    algo, t = chosen_algorithm(COLLECTIVES[coll], nbytes, n, stride, cluster)
    out.predicted_s, out.detail = t, f"{spec_name} {algo}"
    return out


def _dtype_precision(text: str) -> tuple[str, int]:
    t = text.lower()
    if "fp8" in t or "e4m3" in t:
        return "fp8", 1
    if "tf32" in t or "fp32" in t:
        return "tf32", 4
    return ("fp16", 2) if "fp16" in t and "bf16" not in t else ("bf16", 2)


def predict_gemm(i: int, row: dict, specs: Specs) -> KernelRow:
    m, n, k = (_int(row.get(x)) for x in ("m", "n", "k"))
    precision, nbytes = _dtype_precision(row.get("dtype", ""))
    tflops = _float(row.get("tflops"))
    measured = 2.0 * m * n * k / (tflops * 1e12) if tflops > 0 and m and n and k else math.nan
    out = KernelRow(i, row.get("source", ""), f"gemm {precision}", f"{m}x{n}x{k}", measured)
    found = specs.for_gpu(row.get("gpu", ""))
    if found is None or not measured > 0:
        out.skip = "no cluster spec for the GPU" if found is None else "no shape or TFLOP/s"
        return out
    if "grouped" in row.get("library", "").lower() or "group" in row.get("layout", "").lower():
        out.skip = "grouped GEMM: not a single (m, n, k) GEMM"
        return out
    spec, cluster = found
    try:
        out.predicted_s = gemm_time_s(m, n, k, cluster, precision, nbytes)
    except ConfigError as e:
        out.skip = str(e)
    out.detail = spec
    return out


def predict_attention(i: int, row: dict, specs: Specs) -> KernelRow:
    b, sq, skv, h, d = (_int(row.get(x)) for x in ("batch", "seq_q", "seq_kv", "heads", "head_dim"))
    causal = row.get("causal", "").strip().lower() == "true"
    direction = row.get("direction", "").strip().lower()
    flops = 4.0 * b * h * sq * skv * d / (2 if causal else 1)      # FlashAttention-2 paper, sec. 3.1
    ms, tflops = _float(row.get("time_ms")), _float(row.get("tflops"))
    # time as printed, else the time the printed TFLOP/s implies under the same FLOP formula
    measured = ms * 1e-3 if ms > 0 else (flops / (tflops * 1e12) if tflops > 0 else math.nan)
    out = KernelRow(i, row.get("source", ""), f"attention {direction}", f"b{b} s{sq} h{h} d{d}", measured)
    found = specs.for_gpu(row.get("gpu", ""))
    if min(b, sq, skv, h, d) <= 0:        # an unreadable or non-positive dimension: not a shape
        measured = math.nan
    if found is None or not measured > 0 or direction not in ("fwd", "bwd"):
        out.skip = ("no cluster spec for the GPU" if found is None else
                    "no time or TFLOP/s printed" if not measured > 0 else f"direction {direction!r} not fwd/bwd")
        return out
    spec, cluster = found
    fl = flops * (2.5 if direction == "bwd" else 1.0)
    out.predicted_s, out.detail = attention_time_s(fl, direction == "bwd", cluster), spec
    return out


def predict_memory(i: int, row: dict, specs: Specs) -> KernelRow:
    """Streaming kernels: bytes / (HBM bandwidth * memory_bound) + launch overhead. Where the source does
    not print the array size, the steady-state rate is compared (the time of a large array, where the
    launch overhead is negligible): error in rate = error in time."""
    nbytes, gbps = _float(row.get("bytes")), _float(row.get("GBps"))
    kernel = row.get("kernel", "")
    sized = nbytes > 0
    size = nbytes if sized else 1e12
    measured = size / (gbps * 1e9) if gbps > 0 else math.nan
    out = KernelRow(i, row.get("source", ""), "memory", kernel[:40], measured)
    found = specs.for_gpu(row.get("gpu", ""))
    low = kernel.lower()
    if found is None or not measured > 0:
        out.skip = "no cluster spec for the GPU" if found is None else "no bandwidth printed"
    elif any(w in low for w in ("p2p", "nvlink", "h2d", "d2h", "host", "peer", "gpu0", "bidirectional",
                                "unidirectional")):
        out.skip = "copy between devices / host: not an HBM kernel"
    if out.skip:
        return out
    spec, cluster = found
    if sized:
        out.predicted_s = memory_time_s(nbytes, cluster)
    else:
        out.predicted_s = size / (cluster.gpu.hbm_bandwidth * cluster.efficiency.memory_bound)
    out.detail = spec + ("" if sized else " (rate: size not printed)")
    return out


PREDICT = {"collectives": predict_collective, "gemm": predict_gemm, "attention": predict_attention,
           "memory": predict_memory}


def validate_kernels(path: Path, specs_dir: Path) -> tuple[str, list[KernelRow]]:
    with io.StringIO(read_text(path, "CSV"), newline="") as fh:
        reader = csv.DictReader(fh)
        kind = file_kind(reader.fieldnames or [])
        if kind is None:
            raise ConfigError("not a kernel-level file (collectives / gemm / attention / memory header)",
                              source=str(path))
        rows = [{k: (v or "").strip() for k, v in r.items() if k is not None} for r in reader]
    specs = Specs(specs_dir)
    return kind, [_bad_cell(i, r, kind) or PREDICT[kind](i, r, specs) for i, r in enumerate(rows)]


# numeric columns per file: a filled-in cell must be a finite number >= 0 (a blank one is "not printed")
NUMERIC_COLUMNS = {"collectives": ("num_gpus", "num_nodes", "gpus_per_node", "time_us", "algbw_GBps", "busbw_GBps"),
                   "gemm": ("m", "n", "k", "tflops", "time_us"),
                   "attention": ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "tflops", "time_ms"),
                   "memory": ("bytes", "GBps")}


def _bad_cell(i: int, row: dict, kind: str) -> KernelRow | None:
    """The row skipped with the column and the value when a numeric cell is not a finite number >= 0."""
    for col in NUMERIC_COLUMNS[kind]:
        text = row.get(col, "")
        if text == "":
            continue
        x = _float(text)
        if not math.isfinite(x) or x < 0:
            out = KernelRow(i, row.get("source", ""), kind, "", math.nan)
            out.skip = f"bad cell: column {col}={text!r}: must be a finite number >= 0"
            return out
    return None


@dataclass(frozen=True)
class Stats:
    n: int
    mape: float
    bias: float
    max_abs: float


def stats(rows: list[KernelRow]) -> Stats:
    errs = [r.error_pct for r in rows if not r.skip]
    if not errs:
        return Stats(0, math.nan, math.nan, math.nan)
    return Stats(len(errs), sum(map(abs, errs)) / len(errs), sum(errs) / len(errs), max(map(abs, errs)))


def summary(rows: list[KernelRow]) -> dict[str, dict[str, Stats]]:
    """Error statistics overall, per collective / kernel, per scale and per source."""
    def by(key):
        groups: dict[str, list[KernelRow]] = {}
        for r in rows:
            groups.setdefault(key(r), []).append(r)
        return {k: stats(v) for k, v in sorted(groups.items())}
    return {"overall": {"all rows": stats(rows)}, "kind": by(lambda r: r.kind),
            "scale": by(lambda r: r.scale), "source": by(lambda r: short_source(r.source))}


def short_source(source: str) -> str:
    m = re.search(r"github\.com/([\w.-]+/[\w.-]+)/issues/(\d+)", source)
    if m:
        return f"{m.group(1)}#{m.group(2)}"
    return source.split(" ")[0][:40]
