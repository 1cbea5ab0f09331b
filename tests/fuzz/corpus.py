"""Generate a corpus of malformed inputs from the real input files and run the CLI on each (`make fuzz`).

    python tests/fuzz/corpus.py [--per-kind N] [--seed S] [--timeout T] [--out DIR]

Kinds: search spaces, cluster specs, model YAML, estimate flags, measurement CSVs, each trace format
(Kineto, PyTorch ET, Chakra JSON, Chakra ET protobuf, comet graph JSON) and output paths. Each case runs
`comet.cli.main` in a forked child (stdout/stderr to files, 4 GB address-space cap) with a timeout, and
is counted as:
  traceback  "Traceback (most recent call last)" on stderr, exit 3 (the last-resort handler caught a
             bug) or death by a signal;
  hang       still running at the timeout (killed);
  garbage    exit 0 although the input must be rejected (a NaN / inf, or a negated positive number,
             planted where comet reads it; a text attack such as a self-referencing alias, invalid
             UTF-8, a NUL byte), or exit 0 with a non-finite or negative figure in the JSON output.
Exit 0 (valid after all), 1 (infeasible) and 2 (one clear error line) are the accepted outcomes.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import io
import json
import math
import os
import random
import resource
import shutil
import signal
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutate import Mutation, mutate_doc, mutate_text, yaml_text_attacks  # noqa: E402

TRACES = SHARED / "traces"
KINETO_SEED = TRACES / "single_gpu" / "benchmark_simple_add_trace.json.gz"
ET_SEED = TRACES / "single_gpu" / "benchmark_simple_add_et.json.gz"
CHAKRA_JSON_SEED = (TRACES / "chakra_et" / "json_trace.tar.gz", "jsonData/small_chakra.0.json")
CHAKRA_ET_SEED = TRACES / "chakra_et" / "astra_sim_all_reduce_8npus_1MB" / "all_reduce.0.et"
CSV_SEED = SHARED / "calibration" / "measurements.csv"   # schema v2 (SCHEMA.md); the first rows are the seed
KERNEL_CSV_SEEDS = [SHARED / "calibration" / f"{k}.csv" for k in ("gemm", "collectives", "attention", "memory")]
# per format: (list key, fields of each item the reader takes in). A planted NaN / inf / negative value
# there must be refused.
TRACE_READS = {"kineto": ("traceEvents", {"ts", "dur"}),
               "et": ("nodes", {"id", "parent", "ctrl_deps"}),
               "chakra": ("workload_graph", {"Id", "NodeType", "data_deps", "ctrlDeps", "runtime", "comm_size",
                                             "tensor_size", "num_ops"}),
               "graph": ("nodes", {"duration_s", "flops", "bytes", "msg_bytes", "group_size", "shape"})}
GRAPH_EDGE_READS = {"delay_s", "source", "target"}
OUTPUT_KEYS_NON_NEGATIVE = ("_s", "_days", "_usd", "_MWh", "mfu", "tokens_per_s", "_gb_per_gpu", "tflops")


@dataclass
class Case:
    kind: str
    argv: list[str]
    mutation: Mutation
    json_out: bool = False       # stdout is one JSON document to check for garbage
    json_file: str | None = None   # `validate --json FILE`: per-row statuses and predictions


@dataclass
class Outcome:
    case: Case
    code: int | None
    seconds: float
    verdict: str                 # ok | traceback | hang | garbage
    detail: str = ""


# ----------------------------------------------------------------------------- writers

def _yaml_bytes(doc) -> bytes:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()


def _doc_or_text_yaml(seed_doc, seed_bytes: bytes, rng: random.Random, reads=lambda p: True) -> tuple[bytes, Mutation]:
    roll = rng.random()
    if roll < 0.6:
        doc, m = mutate_doc(seed_doc, rng, reads)
        if rng.random() < 0.25:          # a second mutation on top
            doc, m2 = mutate_doc(doc, rng, reads)
            # on the same path the second replaces the first (negate twice gives the valid value back)
            first_holds = m.must_reject and m.path != m2.path
            m = Mutation(f"{m.name}+{m2.name}", f"{m.path} {m2.path}", first_holds or m2.must_reject)
        return _yaml_bytes(doc), m
    if roll < 0.8:
        return mutate_text(seed_bytes, rng, "yaml")
    return yaml_text_attacks(seed_bytes, rng)


def _write(folder: Path, name: str, data: bytes) -> str:
    p = folder / name
    p.write_bytes(data)
    return str(p)


# ----------------------------------------------------------------------------- kinds

def search_cases(n: int, rng: random.Random, work: Path) -> list[Case]:
    seed_path = REPO / "search_spaces" / "tiny.yaml"
    doc = yaml.safe_load(seed_path.read_text())
    doc["cluster"]["spec"] = str(REPO / "cluster_specs" / "h100_dgx.yaml")
    seed_bytes = _yaml_bytes(doc)
    out = []
    for i in range(n):
        if rng.random() < 0.1:           # a grid far too large to enumerate
            big = dict(doc, parallel=dict(doc["parallel"], micro_batch=list(range(1, 1 + rng.choice((500, 5000))))))
            big["cluster"] = dict(doc["cluster"], gpus=list(range(8, 8 * 600, 8)))
            data, m = _yaml_bytes(big), Mutation("huge_grid", "parallel", False)
        else:
            data, m = _doc_or_text_yaml(doc, seed_bytes, rng)
        path = _write(work, f"space{i}.yaml", data)
        out.append(Case("search space", ["search", path, "--executor", "serial", "--trials", "3", "--no-timelines",
                                         "--out", str(work / f"space{i}.out")], m))
    return out


def cluster_cases(n: int, rng: random.Random, work: Path) -> list[Case]:
    seed = REPO / "cluster_specs" / "h100_dgx.yaml"
    doc, raw = yaml.safe_load(seed.read_text()), seed.read_bytes()
    out = []
    for i in range(n):
        data, m = _doc_or_text_yaml(doc, raw, rng)
        path = _write(work, f"cluster{i}.yaml", data)
        out.append(Case("cluster spec", ["estimate", "--model", "gpt_1_7b", "--cluster", path, "--gpus", "64",
                                         "--tp", "2", "--pp", "2", "--global-batch", "64", "--total-tokens", "1e9",
                                         "--json"], m, json_out=True))
    return out


def model_cases(n: int, rng: random.Random, work: Path) -> list[Case]:
    seed = REPO / "comet" / "models" / "llama3_8b.yaml"
    doc, raw = yaml.safe_load(seed.read_text()), seed.read_bytes()
    out = []
    for i in range(n):
        data, m = _doc_or_text_yaml(doc, raw, rng)
        path = _write(work, f"model{i}.yaml", data)
        out.append(Case("model YAML", ["estimate", "--model", path, "--gpus", "16", "--tp", "2", "--global-batch", "32",
                                       "--json"], m, json_out=True))
    return out


FLOAT_FLAGS = ("--total-tokens", "--model", "--cluster")   # 1.5 is a valid value (or a file name) for these
ESTIMATE_BASE = {"--model": "gpt_1_7b", "--gpus": "64", "--tp": "2", "--pp": "2", "--global-batch": "64",
                 "--micro-batch": "1", "--total-tokens": "1e9", "--zero": "1", "--cp": "1", "--vpp": "1"}
BAD_VALUES = ("nan", "inf", "-inf", "-1", "0", "1e7", "1e30", "99999999999999999999", "abc", "", "1.5", "-0",
              "0x10", "1_000", " 8", "NaN", "Infinity", "1e-300", "\udcff", "2" * 400)


def estimate_cases(n: int, rng: random.Random, work: Path) -> list[Case]:
    out = []
    for i in range(n):
        args = dict(ESTIMATE_BASE)
        flag = rng.choice(list(args) + ["--dp", "--precision", "--recompute", "--schedule", "--offload", "--cluster"])
        value = rng.choice(BAD_VALUES)
        args[flag] = value
        must = value.lower() in ("nan", "inf", "-inf", "infinity", "-1", "abc", "") or (
            value in ("0", "-0") and flag not in ("--zero",)) or (value == "1.5" and flag not in FLOAT_FLAGS)
        argv = ["estimate"] + [x for k, v in args.items() for x in (k, v)] + ["--json"]
        out.append(Case("estimate flags", argv, Mutation(f"{flag}={value[:20]!r}", flag, must), json_out=True))
    return out


def csv_cases(n: int, rng: random.Random, work: Path) -> list[Case]:
    if not CSV_SEED.is_file():
        return []
    import csv
    seeds = []
    for path in [CSV_SEED] + [p for p in KERNEL_CSV_SEEDS if p.is_file()]:
        lines = path.read_text().splitlines(keepends=True)
        rows = list(csv.reader(io.StringIO("".join(lines[:4]))))
        numeric = [j for j, h in enumerate(rows[0]) if any(_is_float(r[j]) for r in rows[1:])]
        seeds.append(("".join(lines[:4]).encode(), rows[0], rows[1:], numeric))
    out = []
    for i in range(n):
        seed_bytes, header, body, numeric_cols = seeds[0] if rng.random() < 0.6 else rng.choice(seeds)
        if rng.random() < 0.65 and numeric_cols:
            r, j = rng.randrange(len(body)), rng.choice(numeric_cols)
            new = [list(x) for x in body]
            old = new[r][j]
            value = rng.choice(("nan", "inf", "-inf", "-" + (old or "1"), "0", "abc", "1e400", "", "NaN", "1,5"))
            new[r][j] = value
            buf = io.StringIO()
            csv.writer(buf).writerows([header] + new)
            must = value.lower() in ("nan", "inf", "-inf", "1e400") or (value.startswith("-") and _is_float(old)
                                                                        and float(old) > 0)
            data, m = buf.getvalue().encode(), Mutation(f"cell={value}", f"row{r}.{header[j]}", must and bool(old))
            m.row = r
        elif rng.random() < 0.5:
            data, m = mutate_text(seed_bytes, rng, "csv")
        else:
            drop = rng.randrange(len(header))
            buf = io.StringIO()
            csv.writer(buf).writerows([[c for k, c in enumerate(row) if k != drop] for row in [header] + body])
            data, m = buf.getvalue().encode(), Mutation("drop_column", header[drop], False)
        path = _write(work, f"meas{i}.csv", data)
        out.append(Case("measurement CSV", ["validate", path, "--quiet", "--json", str(work / f"meas{i}.out.json")], m,
                        json_file=str(work / f"meas{i}.out.json")))
    return out


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _trace_doc_cases(kind: str, name: str, doc, n: int, rng: random.Random, work: Path, gz: bool,
                     structural) -> list[Case]:
    raw = json.dumps(doc).encode()
    out = []

    list_key, fields = TRACE_READS[name]

    def reads(path):   # a field of an event / node / edge that the reader takes in
        if name == "graph" and len(path) == 3 and path[0] == "edges":
            return path[2] in GRAPH_EDGE_READS
        inner = path[3] if name == "graph" and len(path) >= 4 and path[2] == "op" else (
            path[2] if len(path) >= 3 else None)
        return path[0] == list_key and inner in fields

    for i in range(n):
        roll = rng.random()
        if roll < 0.55:
            d, m = mutate_doc(doc, rng, reads)
            data = json.dumps(d).encode()
        elif roll < 0.8 and structural:
            d, m = structural(doc, rng)
            data = json.dumps(d).encode()
        else:
            data, m = mutate_text(raw, rng, "json")
        if gz and rng.random() < 0.5:
            data = gzip.compress(data)
        path = _write(work, f"{name}{i}.json" + (".gz" if data[:2] == b"\x1f\x8b" else ""), data)
        cmd = rng.choice(("import", "replay", "inspect"))
        out.append(Case(kind, ["trace", cmd, path, "--json"], m, json_out=True))
    return out


def _et_structural(doc, rng):
    d = json.loads(json.dumps(doc))
    nodes = d["nodes"]
    # roots ("[pytorch|profiler|execution_...]") are their own parents by convention: pick operators
    ops = [i for i, n in enumerate(nodes) if not str(n.get("name", "")).startswith("[pytorch|profiler|execution_")]
    a, b = rng.sample(ops, 2)
    what = rng.choice(("self_parent", "mutual_parent", "null_names", "dup_ids", "list_id", "str_ids"))
    if what == "self_parent":
        nodes[a]["parent"] = nodes[a]["id"]
    elif what == "mutual_parent":
        nodes[a]["parent"], nodes[b]["parent"] = nodes[b]["id"], nodes[a]["id"]
    elif what == "null_names":
        for x in nodes:
            x["name"] = None
    elif what == "dup_ids":
        nodes[b]["id"] = nodes[a]["id"]
    elif what == "list_id":
        nodes[a]["id"] = [nodes[a]["id"]]
    else:
        nodes[a]["id"] = str(nodes[a]["id"])
    return d, Mutation(what, f"nodes[{a}]", what in ("self_parent", "mutual_parent", "list_id", "dup_ids"))


def _kineto_structural(doc, rng):
    d = json.loads(json.dumps(doc))
    ev = d["traceEvents"]
    what = rng.choice(("empty", "zero_dur", "neg_dur", "events_not_list", "event_not_object", "string_dur"))
    i = rng.randrange(len(ev))
    if what == "empty":
        d["traceEvents"] = []
    elif what == "zero_dur":
        for e in ev:
            if "dur" in e:
                e["dur"] = 0
    elif what == "neg_dur":
        ev[i]["dur"] = -abs(ev[i].get("dur", 1) or 1)
    elif what == "events_not_list":
        d["traceEvents"] = {"x": ev[0]}
    elif what == "event_not_object":
        ev[i] = [1, 2, 3]
    else:
        ev[i]["dur"] = "twelve"
    return d, Mutation(what, f"traceEvents[{i}]", what in ("neg_dur", "string_dur"))


def _chakra_structural(doc, rng):
    d = json.loads(json.dumps(doc))
    nodes = d["workload_graph"]
    a, b = rng.sample(range(len(nodes)), 2)
    what = rng.choice(("self_dep", "cycle", "type_word", "id_list", "mixed_ids", "huge_count", "zero_runtime"))
    if what == "self_dep":
        nodes[a]["data_deps"] = [nodes[a]["Id"]]
    elif what == "cycle":
        nodes[a]["data_deps"], nodes[b]["data_deps"] = [nodes[b]["Id"]], [nodes[a]["Id"]]
    elif what == "type_word":
        nodes[a]["NodeType"] = "COMP"
    elif what == "id_list":
        nodes[a]["Id"] = [1, 2]
    elif what == "mixed_ids":
        nodes[a]["Id"] = "n" + str(nodes[a]["Id"])
    elif what == "huge_count":
        d["ngpus"] = 1e308 * 10 if False else 10 ** 400
    else:
        for x in nodes:
            x["runtime"] = 0
    return d, Mutation(what, f"workload_graph[{a}]", what in ("self_dep", "cycle", "type_word", "id_list"))


def _graph_structural(doc, rng):
    d = json.loads(json.dumps(doc))
    nodes, edges = d["nodes"], d["edges"]
    what = rng.choice(("cycle", "self_edge", "shape_int", "id_list", "neg_delay", "dup_node", "no_nodes"))
    a, b = rng.sample(range(len(nodes)), 2)
    if what == "cycle" and edges:
        e = rng.choice(edges)
        edges.append({"source": e["target"], "target": e["source"], "dep": "data"})
    elif what == "self_edge":
        edges.append({"source": nodes[a]["id"], "target": nodes[a]["id"], "dep": "data"})
    elif what == "shape_int":
        nodes[a]["op"]["shape"] = 7
    elif what == "id_list":
        nodes[a]["id"] = [1]
    elif what == "neg_delay" and edges:
        rng.choice(edges)["delay_s"] = -1.0
    elif what == "dup_node":
        nodes.append(dict(nodes[b]))
    else:
        d["nodes"], d["edges"] = [], []
    return d, Mutation(what, f"nodes[{a}]", what in ("cycle", "self_edge", "shape_int", "id_list", "neg_delay"))


def trace_cases(n: int, rng: random.Random, work: Path) -> list[Case]:
    if not TRACES.is_dir():
        return []
    out = []
    kineto = json.loads(gzip.decompress(KINETO_SEED.read_bytes()))
    out += _trace_doc_cases("trace: Kineto", "kineto", kineto, n, rng, work, True, _kineto_structural)
    et = json.loads(gzip.decompress(ET_SEED.read_bytes()))
    out += _trace_doc_cases("trace: PyTorch ET", "et", et, n, rng, work, True, _et_structural)
    with tarfile.open(CHAKRA_JSON_SEED[0]) as tar:
        chakra = json.load(tar.extractfile(CHAKRA_JSON_SEED[1]))
    out += _trace_doc_cases("trace: Chakra JSON", "chakra", chakra, n, rng, work, False, _chakra_structural)
    from comet.trace import load_trace
    from comet.trace.graph_json import graph_to_json
    graph = graph_to_json(load_trace(str(KINETO_SEED)))
    out += _trace_doc_cases("trace: comet graph", "graph", graph, n, rng, work, False, _graph_structural)
    raw = CHAKRA_ET_SEED.read_bytes()
    for i in range(n):
        data = bytearray(raw)
        what = rng.choice(("flip", "truncate", "garbage", "varint"))
        if what == "flip":
            for _ in range(rng.randint(1, 8)):
                j = rng.randrange(len(data))
                data[j] = rng.randrange(256)
        elif what == "truncate":
            data = data[:rng.randrange(len(data))]
        elif what == "garbage":
            data = bytearray(rng.randrange(256) for _ in range(rng.choice((3, 100, 5000))))
        else:
            data = data[:4] + b"\xff" * 12 + data[4:]
        path = _write(work, f"chakra{i}.0.et", bytes(data))
        out.append(Case("trace: Chakra ET", ["trace", rng.choice(("import", "replay")), path, "--json"],
                        Mutation(what, "", False), json_out=True))
    return out


def output_path_cases(n: int, rng: random.Random, work: Path) -> list[Case]:
    ro = work / "readonly"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o555)
    a_file = work / "a_file"
    a_file.write_text("x")
    bad = [f"/nonexistent-comet-fuzz-{os.getpid()}/x.json", str(a_file / "x.json"), str(ro / "x.json"), str(work), "", "x" * 5000,
           "/dev/null/x", str(ro / "sub" / "deeper")]
    est = ["estimate", "--model", "gpt_1_7b", "--gpus", "8", "--tp", "2", "--global-batch", "16"]
    kineto = str(KINETO_SEED)
    out = []
    for i in range(n):
        target = rng.choice(bad)
        form = rng.choice(("timeline", "trace_o", "trace_timeline", "validate_json", "search_out"))
        if form == "timeline":
            argv = est + ["--timeline", target]
        elif form == "trace_o":
            argv = ["trace", "import", kineto, "-o", target]
        elif form == "trace_timeline":
            argv = ["trace", "replay", kineto, "--timeline", target]
        elif form == "validate_json":
            argv = ["validate", str(CSV_SEED), "--quiet", "--json", target]
        else:
            argv = ["search", str(REPO / "search_spaces" / "tiny.yaml"), "--executor", "serial", "--trials", "2",
                    "--no-timelines", "--out", target]
        # every target is unwritable or names a folder where a file is expected (`work` is writable only
        # as a folder): each case must be refused. Root may write a read-only folder and create
        # /nonexistent, so those count only for other users.
        root_may = target.startswith((str(ro), "/nonexistent-comet-fuzz")) and os.geteuid() == 0
        must = not (form == "search_out" and (target == str(work) or target.startswith("/nonexistent-comet-fuzz"))) \
            and not root_may
        out.append(Case("output paths", argv, Mutation(form, target[:60], must)))
    return out


KINDS = {"search space": search_cases, "cluster spec": cluster_cases, "model YAML": model_cases,
         "estimate flags": estimate_cases, "measurement CSV": csv_cases, "traces": trace_cases,
         "output paths": output_path_cases}


# ----------------------------------------------------------------------------- running

def _bad_numbers(obj, key: str = "") -> str | None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            bad = _bad_numbers(v, str(k))
            if bad:
                return bad
    elif isinstance(obj, list):
        for v in obj:
            bad = _bad_numbers(v, key)
            if bad:
                return bad
    elif isinstance(obj, float) and not math.isfinite(obj):
        return f"{key}={obj}"
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool) and obj < 0 \
            and key.endswith(OUTPUT_KEYS_NON_NEGATIVE):
        return f"{key}={obj}"
    return None


def _check_validate_json(case: Case, code: int, seconds: float) -> Outcome:
    """`comet validate` reports a bad cell by skipping its row (the other rows go on): a must-reject cell
    is garbage only if its row was predicted; any non-finite or negative prediction is garbage."""
    try:
        doc = json.loads(Path(case.json_file).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return Outcome(case, code, seconds, "garbage", f"exit 0 but no readable --json output ({exc})")
    rows = doc.get("rows", [])
    row = getattr(case.mutation, "row", None)
    def index(r):      # training rows carry "index", kernel-level rows "row"
        return r.get("index", r.get("row"))

    def skipped(r):
        return r.get("status") == "skipped" or bool(r.get("skipped"))

    if case.mutation.must_reject:
        hit = [r for r in rows if index(r) == row]
        if row is None or (hit and not skipped(hit[0])):
            return Outcome(case, code, seconds, "garbage",
                           f"row {row} with {case.mutation.name} at {case.mutation.path} was "
                           f"{hit[0].get('status', 'predicted') if hit else 'accepted'}")
    for r in rows:
        for key in ("predicted", "predicted_s", "error_pct"):
            v = r.get(key)
            if isinstance(v, float) and not math.isfinite(v) or (key != "error_pct" and isinstance(v, (int, float))
                                                                  and v < 0):
                return Outcome(case, code, seconds, "garbage", f"row {r.get('index')} {key}={v}")
    return Outcome(case, code, seconds, "ok")


def run_case(case: Case, timeout: float, work: Path) -> Outcome:
    out_f, err_f = work / "stdout.txt", work / "stderr.txt"
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:   # child: the CLI as a user runs it, with stdout / stderr to files
        try:
            resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))
            os.setpgid(0, 0)
            fo, fe = os.open(out_f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), os.open(err_f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fo, 1)
            os.dup2(fe, 2)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), write_through=True)
            from comet.cli import main
            code = main(list(case.argv))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(code) & 0xFF)
        except BaseException:  # noqa: BLE001 - an escaped exception is exactly what the runner detects
            import traceback
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(97)
    deadline = t0 + timeout
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        return Outcome(case, None, timeout, "hang")
    seconds = time.monotonic() - t0
    err = err_f.read_text(errors="replace")
    if os.WIFSIGNALED(status):
        return Outcome(case, -os.WTERMSIG(status), seconds, "traceback", f"killed by signal {os.WTERMSIG(status)}")
    code = os.WEXITSTATUS(status)
    if "Traceback (most recent call last)" in err or code in (3, 97):
        return Outcome(case, code, seconds, "traceback", err.strip().splitlines()[-1][:300] if err.strip() else "")
    if code == 0 and case.json_file:
        return _check_validate_json(case, code, seconds)
    if code == 0:
        if case.mutation.must_reject:
            return Outcome(case, code, seconds, "garbage", f"accepted {case.mutation.name} at {case.mutation.path}")
        if case.json_out:
            text = out_f.read_text(errors="replace").strip()
            try:
                doc = json.loads(text, parse_constant=lambda c: float(c)) if text else None
            except json.JSONDecodeError:
                return Outcome(case, code, seconds, "garbage", "stdout is not valid JSON")
            bad = _bad_numbers(doc)
            if bad or "NaN" in text or "Infinity" in text:
                return Outcome(case, code, seconds, "garbage", f"output holds {bad or 'NaN/Infinity'}")
    return Outcome(case, code, seconds, "ok", err.strip().splitlines()[-1][:200] if err.strip() else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-kind", type=int, default=120, help="cases per kind (traces: per format)")
    ap.add_argument("--seed", type=int, default=None, help="corpus seed (default: from the clock, printed)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a case counts as a hang")
    ap.add_argument("--out", help="keep the corpus and a JSON report here (default: a temp folder, removed)")
    ap.add_argument("--kinds", help="comma-separated subset of: " + ", ".join(KINDS))
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else int(time.time())
    work = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="comet-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ["COMET_CRASH_DIR"] = str(work / "crash")
    rng = random.Random(seed)
    import comet.cli
    comet.cli.build_parser()                      # import every subcommand once, before forking
    kinds = [k.strip() for k in a.kinds.split(",")] if a.kinds else list(KINDS)
    cases: list[Case] = []
    for kind in kinds:
        folder = work / kind.replace(" ", "_")
        folder.mkdir(exist_ok=True)
        made = KINDS[kind](a.per_kind, rng, folder)
        if not made:
            print(f"{kind}: skipped (its seed files under ../shared are missing)")
        cases += made
    print(f"corpus seed {seed}: {len(cases)} malformed inputs in {work}", flush=True)
    outcomes = []
    t0 = time.monotonic()
    for i, case in enumerate(cases, 1):
        outcomes.append(run_case(case, a.timeout, work))
        if i % 100 == 0:
            print(f"  {i}/{len(cases)} run, {time.monotonic() - t0:.0f} s", flush=True)
    by_kind = collections.defaultdict(collections.Counter)
    for o in outcomes:
        by_kind[o.case.kind][o.verdict] += 1
        by_kind[o.case.kind][f"exit {o.code}"] += 1
    print(f"\n{'kind':<22}{'cases':>6}{'traceback':>10}{'hang':>6}{'garbage':>8}   exit codes")
    total = collections.Counter()
    for kind, c in by_kind.items():
        n = sum(v for k, v in c.items() if not k.startswith("exit"))
        codes = ", ".join(f"{k[5:]}: {v}" for k, v in sorted(c.items()) if k.startswith("exit"))
        print(f"{kind:<22}{n:>6}{c['traceback']:>10}{c['hang']:>6}{c['garbage']:>8}   {codes}")
        total.update(c)
    n = len(outcomes)
    print(f"{'total':<22}{n:>6}{total['traceback']:>10}{total['hang']:>6}{total['garbage']:>8}   "
          + ", ".join(f"{k[5:]}: {v}" for k, v in sorted(total.items()) if k.startswith("exit")))
    bad = [o for o in outcomes if o.verdict != "ok"]
    for o in bad[:60]:
        print(f"  {o.verdict:<9} {o.case.kind:<20} {o.case.mutation.name} {o.case.mutation.path[:40]!r}: "
              f"{o.detail[:160]}  argv={' '.join(o.case.argv)[:160]}")
    report = [{"kind": o.case.kind, "argv": o.case.argv, "mutation": o.case.mutation.__dict__, "exit": o.code,
               "seconds": round(o.seconds, 2), "verdict": o.verdict, "detail": o.detail} for o in outcomes]
    (work / "report.json").write_text(json.dumps(report, indent=1))
    print(f"wall {time.monotonic() - t0:.0f} s; report: {work / 'report.json'}")
    ro = next(work.glob("*/readonly"), None)
    if ro:
        ro.chmod(0o755)
    if not a.out:
        shutil.rmtree(work, ignore_errors=True)
    for made in Path("/").glob(f"nonexistent-comet-fuzz-{os.getpid()}"):   # a search --out run as root made it
        shutil.rmtree(made, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
