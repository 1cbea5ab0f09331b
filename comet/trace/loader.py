"""Find, open and classify trace files; import them into one flat op graph.

Inputs: directories (searched recursively), `.json`, `.json.gz`, `.gz`, `.tar`, `.tar.gz`/`.tgz`
archives (every member is read; macOS `._*` resource files are skipped), Chakra `.et` protobuf, and
comet's own graph JSON (`comet trace import -o`). The content decides the format, not the name:
Kineto (`traceEvents`), PyTorch ET (`schema` + `nodes`), Chakra JSON (`workload_graph`), comet graph.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from comet.errors import TraceError
from comet.trace import chakra, graph_json
from comet.trace.common import RankTrace, rank_from_name
from comet.trace.kineto import parse_kineto
from comet.trace.link import apply_et_sizes, link
from comet.trace.pytorch_et import comm_records, is_pytorch_et, parse_pytorch_et
from comet.trace.validate import check_trace_document, decode_json

_EXTS = (".json", ".json.gz", ".gz", ".tar", ".tar.gz", ".tgz", ".et")


@dataclass
class TraceFile:
    name: str            # path, or "archive::member"
    kind: str            # "kineto" | "pytorch_et" | "chakra_json" | "chakra_et" | "comet_graph"
    doc: object          # parsed JSON (dict) or the raw bytes of a .et


def _is_archive(name: str) -> bool:
    return name.endswith((".tar.gz", ".tgz", ".tar"))


def expand(paths) -> list[Path]:
    out: list[Path] = []
    for p in ([paths] if isinstance(paths, (str, Path)) else list(paths)):
        if "::" in str(p) and Path(str(p).split("::")[0]).is_file():
            out.append(Path(str(p)))         # one member of an archive: "archive.tar.gz::dir/file.json"
            continue
        p = Path(p)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(_EXTS)
                           and not f.name.startswith("._"))
            if not found:
                raise TraceError("directory holds no trace files (.json, .json.gz, .tar.gz, .tgz, .et)", path=str(p))
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise TraceError("no such file or directory", path=str(p))
    return out


def read_files(paths) -> list[TraceFile]:
    files: list[TraceFile] = []
    for p in expand(paths):
        member = None
        if "::" in str(p):
            p, member = Path(str(p).split("::")[0]), str(p).split("::", 1)[1]
        data = _read_bytes(p)
        if member is not None:
            chosen = [f for f in _read_tar(p, data) if f.name.split("::", 1)[1] == member]
            if not chosen:
                raise TraceError(f"archive has no trace file {member!r}", path=str(p))
            files += chosen
        elif _is_archive(p.name) or (data[:2] == b"\x1f\x8b" and _looks_tar(p, data)):
            files += _read_tar(p, data)
        else:
            files.append(_decode(str(p), data))
    return files


def _read_bytes(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}", path=str(p)) from None


def _looks_tar(p: Path, data: bytes) -> bool:
    if p.name.endswith(".json.gz"):
        return False
    try:
        head = zlib.decompressobj(31).decompress(data[:4096], 1024)
    except zlib.error:
        return False
    return len(head) >= 262 and head[257:262] == b"ustar"


def _read_tar(p: Path, data: bytes) -> list[TraceFile]:
    out = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for m in tar.getmembers():
                base = m.name.rsplit("/", 1)[-1]
                if not m.isfile() or base.startswith("._") or not base.endswith(_EXTS):
                    continue
                f = tar.extractfile(m)
                out.append(_decode(f"{p}::{m.name}", f.read() if f else b""))
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise TraceError(f"bad or truncated tar archive ({exc})", path=str(p)) from None
    if not out:
        raise TraceError("archive holds no trace files (.json, .json.gz, .et)", path=str(p))
    return out


def _decode(name: str, data: bytes) -> TraceFile:
    if name.endswith(".et"):
        return TraceFile(name, "chakra_et", data)
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"bad or truncated gzip data ({exc})", path=name) from None
    doc = decode_json(data, name)
    kind = _classify(name, doc)
    check_trace_document(kind, doc, name)     # comet/trace/validate.py: types, ranges, ids, cycles
    return TraceFile(name, kind, doc)


def _classify(name: str, doc) -> str:
    if isinstance(doc, dict):
        if isinstance(doc.get("traceEvents"), list):
            return "kineto"
        if is_pytorch_et(doc):
            return "pytorch_et"
        if isinstance(doc.get("workload_graph"), list):
            return "chakra_json"
        if graph_json.is_graph_json(doc):
            return "comet_graph"
        keys = ", ".join(list(doc)[:6]) or "none"
    else:
        keys = f"a JSON {type(doc).__name__}"
    raise TraceError(f"not a Kineto trace, PyTorch execution trace, Chakra JSON or comet graph "
                     f"(top-level keys: {keys})", path=name)


def load_trace(paths, step=None, sizes_from_et: bool = True) -> nx.DiGraph:
    """Import traces (files, directories, archives) into one flat op graph (comet/graph/ir.py).

    Kineto traces become the graph; PyTorch ETs next to them only supply collective sizes (matched by
    pid, else by rank number); ETs alone, Chakra ET and Chakra JSON are imported as they are.
    `step`: None (last complete ProfilerStep), an int, or "all".
    """
    files = read_files(paths)
    graphs = [f for f in files if f.kind == "comet_graph"]
    if graphs:
        if len(files) > 1:
            raise TraceError("a comet graph JSON must be given alone", path=graphs[0].name)
        return graph_json.graph_from_json(graphs[0].doc, graphs[0].name)
    kineto = [parse_kineto(f.doc, f.name, step, rank_from_name(f.name)) for f in files if f.kind == "kineto"]
    ets = [f for f in files if f.kind == "pytorch_et"]
    traces: list[RankTrace] = list(kineto)
    if kineto:
        if sizes_from_et:
            _attach_ets(kineto, ets)
    else:
        for i, f in enumerate(ets):
            r = rank_from_name(f.name)
            traces.append(parse_pytorch_et(f.doc, f.name, r if r is not None else i))
    chakra_files = [f for f in files if f.kind in ("chakra_et", "chakra_json")]
    for i, f in enumerate(chakra_files):
        r = rank_from_name(f.name, dotted=True)
        r = r if r is not None else i
        traces.append(chakra.parse_chakra_et(f.doc, f.name, r) if f.kind == "chakra_et"
                      else chakra.parse_chakra_json(f.doc, f.name, r))
    if not traces:
        raise TraceError("no trace found", path=", ".join(f.name for f in files) or str(paths))
    return link(traces, where=traces[0].source)


def _attach_ets(kineto: list[RankTrace], ets: list[TraceFile]) -> None:
    by_pid = {k.pid: k for k in kineto if k.pid is not None}
    by_rank = {k.rank: k for k in kineto}
    for f in ets:
        pid = f.doc.get("pid")
        target = by_pid.get(pid)
        if target is None:
            r = rank_from_name(f.name)
            target = by_rank.get(r) if r is not None else (kineto[0] if len(kineto) == 1 == len(ets) else None)
        if target is None or not target.comms:
            continue
        if any(target.nodes[n].msg_bytes for n in target.comms):
            continue                    # the Kineto args already carry sizes
        apply_et_sizes(target, comm_records(f.doc, f.name), f.name)
