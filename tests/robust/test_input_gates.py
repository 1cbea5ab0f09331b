"""The validation layers by input kind: YAML documents, CLI flags and paths, trace formats, and the CLI's
last-resort handler. Each bad input is one line naming the file / flag / node, the rule and the value,
exit 2; an unexpected exception is one line, a crash report with the traceback, exit 3."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml

from comet.cli import main
from comet.config.cluster import load_cluster
from comet.config.document import MAX_BYTES, read_yaml
from comet.config.model import load_model
from comet.errors import ConfigError, TraceError
from comet.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "cluster_specs" / "h100_dgx.yaml"
ESTIMATE = ["estimate", "--model", "gpt_1_7b", "--gpus", "8", "--tp", "2", "--global-batch", "16"]


def _one_line(capsys, argv, code=2) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# ----------------------------------------------------------------------------- YAML documents

@pytest.mark.parametrize("text, message", [
    ("hbm: .nan\n", "hbm: must be a finite number, got nan"),
    ("a: {b: [1, .inf]}\n", r"a.b\[1\]: must be a finite number, got inf"),
    ("a: 1.0e+300\n", "must be at most 1e\\+18 in magnitude"),
    ("a: &x [1, *x]\n", r"a\[1\]: refers to itself through a YAML alias"),
    ("a: 1\nb: 2\na: 3\n", "duplicate key 'a' at line 3 \\(first at line 1\\)"),
    ("x: " + "[" * 60 + "]" * 60 + "\n", "nested too deeply"),
    ("a0: &a0 [1,1,1,1,1,1,1,1,1]\n" + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n"
                                               for i in range(1, 9)), "alias bomb"),
])
def test_yaml_gate_rejects(tmp_path, text, message):
    p = tmp_path / "x.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_yaml(p)


@pytest.mark.parametrize("data, message", [
    (gzip.compress(b"a: 1\n"), "gzip-compressed"),
    (b"a: 1\n\x00\x01", "binary file \\(NUL byte at offset 5\\)"),
    (b"a: caf\xe9\n", "not UTF-8 text: invalid byte 0xe9 at line 1"),
])
def test_yaml_gate_recognises_binary(tmp_path, data, message):
    p = tmp_path / "x.yaml"
    p.write_bytes(data)
    with pytest.raises(ConfigError, match=message):
        read_yaml(p)


def test_yaml_gate_size_bound_and_bom(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_BYTES + 1))
    with pytest.raises(ConfigError, match="may be at most"):
        read_yaml(big)
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbf" + H100.read_bytes())      # saved by an editor with a BOM: fine
    assert load_cluster(bom).gpu.hbm_GB == 80


def test_nan_never_passes_a_positive_rule(tmp_path, capsys):
    doc = yaml.safe_load(H100.read_text())
    doc["gpu"]["hbm_GB"] = float("nan")
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    err = _one_line(capsys, ESTIMATE + ["--cluster", str(p)])
    assert "gpu.hbm_GB: must be a finite number, got nan" in err


def test_model_nul_in_path_and_word_numbers(tmp_path, capsys):
    m = tmp_path / "m.yaml"
    m.write_text((ROOT / "comet" / "models" / "llama3_8b.yaml").read_text().replace("layers: 32", "layers: .nan"))
    with pytest.raises(ConfigError, match="layers: must be a finite number"):
        load_model(str(m))
    err = _one_line(capsys, ["estimate", "--model", "x\x00.yaml", "--gpus", "8", "--global-batch", "8"])
    assert "NUL byte" in err


# ----------------------------------------------------------------------------- flags and paths

@pytest.mark.parametrize("flag, value, message", [
    ("--total-tokens", "nan", "must be a finite number"), ("--total-tokens", "-1", "must be > 0"),
    ("--gpus", "0", "must be >= 1"), ("--tp", "1e3", "must be an integer"), ("--zero", "-1", "must be >= 0"),
])
def test_estimate_flags(capsys, flag, value, message):
    err = _one_line(capsys, ESTIMATE + [flag, value])
    assert flag in err and message in err


def test_too_many_micro_batches_refused_with_the_number(capsys):
    err = _one_line(capsys, ["estimate", "--model", "gpt_1_7b", "--gpus", "8", "--global-batch", "10000000"])
    assert "1,250,000 micro-batches per step" in err and "65,536" in err


@pytest.mark.parametrize("argv", [
    ESTIMATE + ["--timeline", "/nonexistent-comet/t.json"],
    ["validate", "--json", "/nonexistent-comet/v.json"],
    ["search", str(ROOT / "search_spaces" / "tiny.yaml"), "--out", "/etc/hostname/x"],
])
def test_output_locations_checked_before_work(capsys, argv):
    err = _one_line(capsys, argv)
    assert "cannot" in err


def test_output_path_that_is_a_folder(tmp_path, capsys):
    err = _one_line(capsys, ESTIMATE + ["--timeline", str(tmp_path)])
    assert "is a folder" in err


# ----------------------------------------------------------------------------- traces

def _et(nodes) -> dict:
    return {"schema": "1.0.1", "pid": 1, "nodes": nodes}


def _node(i, parent, name="aten::mm"):
    return {"id": i, "name": name, "parent": parent, "tid": 1, "inputs": [], "outputs": []}


@pytest.mark.parametrize("nodes, message", [
    ([_node(1, 1, "[pytorch|profiler|execution_trace|process]"), _node(2, 2)], "node 2 is its own parent"),
    ([_node(1, 1, "[pytorch|profiler|execution_trace|process]"), _node(2, 3), _node(3, 2)],
     "parent cycle between nodes (2 -> 3 -> 2|3 -> 2 -> 3)"),
    ([_node(1, 1, "[pytorch|profiler|execution_trace|process]"), _node(2, 1, None)], r"nodes\[1\].name \(node 2\)"),
    ([_node(1, 1), _node(1, 1)], "duplicate node id 1"),
    ([_node([1], 1)], r"nodes\[0\].id must be an integer"),
])
def test_pytorch_et_structure(tmp_path, nodes, message):
    p = tmp_path / "et.json"
    p.write_text(json.dumps(_et(nodes)))
    with pytest.raises(TraceError, match=message):
        load_trace(p)


@pytest.mark.parametrize("change, message", [
    (lambda g: g[0].update(data_deps=[g[0]["Id"]]), "node 1 is its own data dependency"),
    (lambda g: (g[0].update(data_deps=[2]), g[1].update(data_deps=[1])), "data dependency cycle between nodes"),
    (lambda g: g[0].update(NodeType="COMP"), r"NodeType \(node 1\) must be an integer, got 'COMP'"),
    (lambda g: g[0].update(Id=[1, 2]), r"workload_graph\[0\].Id must be an integer"),
    (lambda g: g[1].update(runtime=-5), r"runtime \(node 2\) must be >= 0, got -5"),
])
def test_chakra_json_structure(tmp_path, change, message):
    graph = [{"Id": 1, "Name": "a", "NodeType": 4, "data_deps": [], "runtime": 3},
             {"Id": 2, "Name": "b", "NodeType": 4, "data_deps": [1], "runtime": 4}]
    change(graph)
    p = tmp_path / "chakra.0.json"
    p.write_text(json.dumps({"workload_graph": graph}))
    with pytest.raises(TraceError, match=message):
        load_trace(p)


def test_trace_nesting_bound_and_kineto_negative_duration(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    assert "nested deeper than" in _one_line(capsys, ["trace", "import", str(deep)])
    k = tmp_path / "k.json"
    k.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
                                              "ts": 10, "dur": -3}]}))
    assert "traceEvents[0].dur must be >= 0, got -3" in _one_line(capsys, ["trace", "replay", str(k)])


# ----------------------------------------------------------------------------- last resort

def test_unexpected_exception_is_one_line_exit_3_with_a_crash_report(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("COMET_CRASH_DIR", str(tmp_path))
    import comet.cli.estimate as est

    def boom(*a, **k):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(est, "load_model", boom)
    err = _one_line(capsys, ESTIMATE, code=3)
    assert "internal error (a bug in comet" in err and "ZeroDivisionError" in err and "comet/cli/estimate.py" in err
    reports = list(tmp_path.glob("crash-*.txt"))
    assert len(reports) == 1 and str(reports[0]) in err
    text = reports[0].read_text()
    assert "Traceback (most recent call last)" in text and "boom" in text and "estimate --model" in text


# ----------------------------------------------------------------------------- cluster cross-field rules

def _cluster(tmp_path, change) -> Path:
    doc = yaml.safe_load(H100.read_text())
    change(doc)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_network_domains_must_nest(tmp_path):
    def three_tiers(d):
        d["network"].append(dict(d["network"][1], name="spine", size=0))
        d["network"][1]["size"] = 12                       # 12 is not a whole number of 8-GPU nodes
        d["cost"]["network_usd_per_GBps"] = [0.0, 60.0, 10.0]
    with pytest.raises(ConfigError, match=r"network\[1\].size: a infiniband domain of 12 GPUs must hold whole "
                                          r"nvlink domains of 8"):
        load_cluster(_cluster(tmp_path, three_tiers))


def test_a_price_per_network_tier(tmp_path):
    with pytest.raises(ConfigError, match=r"cost.network_usd_per_GBps: lists 1 prices for 2 network dimensions"):
        load_cluster(_cluster(tmp_path, lambda d: d["cost"].update(network_usd_per_GBps=[0.0])))


def test_job_must_span_whole_domains(tmp_path, capsys):
    path = _cluster(tmp_path, lambda d: d["network"][0].update(size=3))
    err = _one_line(capsys, ["estimate", "--model", "gpt_1_7b", "--cluster", str(path), "--gpus", "64",
                             "--global-batch", "64"])
    assert "gpus (64) must be a multiple of the nvlink domain size (3)" in err


def test_measurement_csv_gate(tmp_path, capsys):
    seed = ROOT.parent / "shared" / "calibration" / "measurements.csv"
    if not seed.is_file():
        pytest.skip("../shared/calibration/measurements.csv is missing")
    head = "".join(seed.read_text().splitlines(keepends=True)[:2])
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + head.encode())      # saved by a spreadsheet with a BOM: read as usual
    out = tmp_path / "v.json"
    assert main(["validate", str(bom), "--quiet", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["rows"][0]["status"] in ("ok", "infeasible")
    capsys.readouterr()
    gz = tmp_path / "m.csv"
    gz.write_bytes(gzip.compress(head.encode()))
    assert "gzip-compressed" in _one_line(capsys, ["validate", str(gz), "--quiet"])
