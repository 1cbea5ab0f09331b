"""End-to-end `comet estimate`, and its bad-input behaviour (one line, exit 2)."""

import gzip
import json

import pytest

from comet.cli import main

BASE = ["estimate", "--model", "gpt3_175b", "--gpus", "1024", "--tp", "8", "--pp", "8",
        "--micro-batch", "1", "--global-batch", "1536", "--precision", "bf16", "--recompute", "selective"]


def test_estimate_json(capsys):
    assert main(BASE + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "memory_gb_per_gpu", "feasible", "reason",
                "breakdown"):
        assert key in out
    assert out["feasible"] is True
    assert out["tokens_per_s"] == pytest.approx(1536 * 2048 / out["step_time_s"])
    assert sum(out["breakdown"].values()) == pytest.approx(out["step_time_s"])
    assert 0.2 < out["mfu"] < 0.8


def test_estimate_table_and_timeline(capsys, tmp_path):
    out_file = tmp_path / "t.json.gz"
    assert main(["estimate", "--model", "gpt_1_7b", "--gpus", "8", "--tp", "2", "--pp", "2", "--global-batch", "16",
                 "--timeline", str(out_file)]) == 0
    text = capsys.readouterr().out
    assert "step time" in text and "MFU" in text and "pipeline bubble" in text
    doc = json.loads(gzip.decompress(out_file.read_bytes()))
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} >= {"X", "M"}
    assert all(isinstance(e["tid"], int) for e in events if "tid" in e)
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"} <= named   # every track has a name
    assert any(e["cat"] == "p2p" for e in events if e["ph"] == "X")           # exposed PP has its track
    assert not any(e.get("name") == "fc1" for e in events)                     # op level is opt-in
    assert "start of the step" in doc["otherData"]["time_origin"]
    assert min(e["ts"] for e in events if e["ph"] == "X") == 0.0   # something starts at the origin


def test_timeline_ops_opt_in(capsys, tmp_path):
    out_file = tmp_path / "t.json"
    assert main(["estimate", "--model", "gpt_1_7b", "--gpus", "8", "--tp", "2", "--pp", "2", "--global-batch", "16",
                 "--timeline", str(out_file), "--timeline-ops", "--json"]) == 0
    events = json.loads(out_file.read_text())["traceEvents"]
    assert any(e.get("name") == "fc1" for e in events)
    assert all(isinstance(e["tid"], int) for e in events if "tid" in e)


def test_estimate_config_file_and_outputs(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: gpt3_175b\ngpus: 1024\ntp: 8\npp: 8\nglobal_batch: 1536\nrecompute: selective\n")
    assert main(["estimate", "--config", str(cfg), "-o", str(tmp_path / "r.json"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((tmp_path / "r.json").read_text())
    assert printed == written and printed["model"] == "gpt3_175b" and printed["parallel"]["dp"] == 16
    # a flag overrides the file; CSV is one header and one row with the design and the metrics
    assert main(["estimate", "--config", str(cfg), "--pp", "16", "-o", str(tmp_path / "r.csv")]) == 0
    import csv
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert len(rows) == 1 and rows[0]["pp"] == "16" and rows[0]["dp"] == "8" and float(rows[0]["step_time_s"]) > 0


@pytest.mark.parametrize("text,error", [
    ("model: gpt3_175b\ngpus: 64\nglobal_batch: 8\ntensor: 8\n", "run.yaml: tensor: unknown key"),
    ("model: gpt3_175b\ngpus: 64\nglobal_batch: 8\ntp: eight\n", "tp: must be an integer, got 'eight'"),
    ("- a\n", "run.yaml: must be a mapping"),
])
def test_estimate_config_bad_input_one_json_object(tmp_path, capsys, text, error):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    assert main(["estimate", "--config", str(cfg), "--json"]) == 2
    cap = capsys.readouterr()
    doc = json.loads(cap.out)   # stdout is one JSON object even for bad input
    assert doc["status"] == "error" and error in doc["reason"]
    assert cap.err.count("\n") == 1 and error in cap.err


def test_infeasible_json_names_remedies(capsys):
    assert main(["estimate", "--model", "gpt3_175b", "--gpus", "64", "--tp", "8", "--global-batch", "64",
                 "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "infeasible" and doc["extra"]["remedies"]
    assert all(r["step_time_s"] > 0 and r["memory_gb_per_gpu"] < 80 for r in doc["extra"]["remedies"])


def test_infeasible_memory_is_a_result(capsys):
    assert main(["estimate", "--model", "gpt3_175b", "--gpus", "8", "--global-batch", "8", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] is False and "HBM holds 80 GB" in out["reason"] and out["step_time_s"] is None


@pytest.mark.parametrize("args,text", [
    (["--model", "nope", "--global-batch", "8"], "unknown model 'nope'"),
    (["--model", "gpt3_175b", "--gpus", "1024", "--tp", "3", "--global-batch", "8"], "must be divisible by tp*pp*cp"),
    (["--model", "gpt3_175b", "--gpus", "64", "--tp", "8", "--global-batch", "8", "--cluster", "missing.yaml"],
     "missing.yaml: file not found"),
    (["--model", "gpt3_175b", "--gpus", "0", "--global-batch", "8"], "--gpus: must be >= 1, got 0"),
    (["--model", "gpt3_175b", "--gpus", "64", "--tp", "8", "--global-batch", "8", "--precision", "fp8",
      "--cluster", "cluster_specs/a100_dgx.yaml"], "has no fp8 tensor cores"),
])
def test_bad_input_one_line_exit_2(args, text, capsys, monkeypatch, repo_root):
    monkeypatch.chdir(repo_root)
    assert main(["estimate"] + args) == 2
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_yaml_model_file(tmp_path, capsys):
    p = tmp_path / "m.yaml"
    p.write_text("name: m\nlayers: 4\nhidden: 64\nheads: 4\nvocab: 100\nseq_len: 16\nwidth: 3\n")
    assert main(["estimate", "--model", str(p), "--gpus", "1", "--global-batch", "1"]) == 2
    assert "m.yaml: width: unknown key" in capsys.readouterr().err
