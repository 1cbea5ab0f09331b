"""`comet validate` end to end on a small CSV, the JSON fields, bad input, and the markdown report."""

import json

import pytest

from comet.cli import main
from comet.validate.predict import ClusterCache, predict
from comet.validate.rows import load_cases
from comet.validate.runner import repo_root, run_validation


def test_cli_writes_rows_and_summary(small_csv, tmp_path, capsys):
    out = tmp_path / "v.json"
    assert main(["validate", str(small_csv), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert len(rows) == 5
    for r in rows:
        for key in ("source", "model", "metric", "value", "predicted", "error_pct", "status", "reason"):
            assert key in r
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "skipped", "ok"]
    ok = rows[0]
    assert ok["error_pct"] == pytest.approx((ok["predicted"] - ok["value"]) / ok["value"] * 100)
    assert "global batch not stated" in rows[3]["reason"] and rows[3]["predicted"] is None
    assert [r["index"] for r in rows] == [0, 1, 2, 3, 4]
    assert all(isinstance(r["assumptions"], list) for r in rows) and rows[0]["memory_gb_per_gpu"] > 0
    summary = doc["summary"]
    assert summary["counts"] == {"ok": 4, "skipped": 1, "infeasible": 0}
    assert summary["overall"]["n"] == 4
    errs = [abs(r["error_pct"]) for r in rows if r["status"] == "ok"]
    assert summary["overall"]["mape_pct"] == pytest.approx(sum(errs) / 4, abs=1e-3)
    assert summary["overall"]["max_abs_error_pct"] == pytest.approx(max(errs), abs=1e-3)
    assert "Korthikanti et al." in summary["by_source"]
    assert set(summary["by_metric"]) >= {"iteration_time_s", "mfu", "layer_fwd_bwd_time_ms"}
    text = capsys.readouterr().out
    assert "MAPE" in text and "held-out" in text and "global batch not stated" in text


def test_missing_csv_is_one_line_exit_2(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.csv" in err and "not found" in err


def test_metrics_are_consistent_with_one_step_time(small_csv):
    """The time row and the MFU row of one run describe the same step: MFU = model FLOPs / (t * GPUs * peak)."""
    cases = load_cases(small_csv)
    cache = ClusterCache(repo_root() / "cluster_specs")
    t, mfu = predict(cases[0], cache).predicted, predict(cases[1], cache).predicted
    m = cases[0].model
    model_flops = 72 * 4 * m.layers * m.seq_len * m.hidden ** 2 * (
        1 + m.seq_len / (6 * m.hidden) + m.vocab / (12 * m.hidden * m.layers))
    assert mfu == pytest.approx(model_flops / (t * 8 * 312e12) * 100, rel=1e-9)


def test_layer_row_is_forward_recompute_backward(small_csv):
    case = load_cases(small_csv)[2]
    pred = predict(case, ClusterCache(repo_root() / "cluster_specs"))
    assert pred.status == "ok" and 5 < pred.predicted < 60
    assert sum(pred.breakdown.values()) == pytest.approx(pred.predicted)


def test_docs_report(small_csv, tmp_path):
    md = tmp_path / "validation.md"
    assert main(["validate", str(small_csv), "--quiet", "--docs", str(md)]) == 0
    text = md.read_text()
    for section in ("## Summary", "held-out", "## Calibrated parameters", "efficiency.gemm", "## Rows",
                    "## Known limitations", "global batch not stated"):
        assert section in text
    png = tmp_path / "validation.png"                   # the error plot the report embeds
    assert "](validation.png)" in text and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fit_writes_yaml_in_place(tmp_path):
    """The fit on a tiny CSV: values stay inside their bounds and are written with a comment, other keys kept."""
    import shutil
    from comet.config.cluster import load_cluster
    from comet.validate.calibrate import PARAMS, fit_gpu, get_value, write_fit
    from csvrows import row, write_csv
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(repo_root() / "cluster_specs" / "a100_dgx.yaml", specs)
    csv = write_csv(tmp_path / "f.csv", [row(), row(value="1.42", recompute="full", sequence_parallel="false"),
                                         row(metric="mfu", value="41.5", unit="%")])
    cases = load_cases(csv)
    fit = fit_gpu(cases, load_cluster(specs / "a100_dgx.yaml"), "a100_dgx.yaml")
    assert fit.train_rows == 2 and fit.held_out_rows == 1
    assert fit.loss_end <= fit.loss_start
    assert not fit.sensitive["efficiency.attention_fwd"]     # unfused attention: flash efficiency unseen
    before = (specs / "a100_dgx.yaml").read_text()
    write_fit(fit, specs, "f.csv", "test")
    after = (specs / "a100_dgx.yaml").read_text()
    spec = load_cluster(specs / "a100_dgx.yaml")
    bounds = {p.key: p for p in PARAMS}
    for key, value in fit.values.items():
        if fit.sensitive[key]:
            assert bounds[key].lo <= get_value(spec, key) <= bounds[key].hi
            assert get_value(spec, key) == pytest.approx(value, rel=2e-3)
    assert "# Calibrated" in after and "fit " in after
    assert spec.gpu.peak_tflops == load_cluster(repo_root() / "cluster_specs" / "a100_dgx.yaml").gpu.peak_tflops
    assert len(after.splitlines()) >= len(before.splitlines())
    write_fit(fit, specs, "f.csv", "test")     # re-running replaces the header, does not stack it
    assert (specs / "a100_dgx.yaml").read_text().count("# Calibrated") == 1


def _published():
    from comet.validate.runner import default_csv
    csv = default_csv()
    if not csv.is_file():
        pytest.skip("../shared/calibration/measurements.csv not found")
    return run_validation(csv)


@pytest.mark.slow
def test_published_structure():
    """The shipped calibration on the shipped CSV: every row modelled or skipped with a reason, the layer
    blocks' FLOPs equal the analytical count, held-out rows reported."""
    val = _published()
    assert val.warnings == []
    assert val.summary["held_out"].n > 0


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="Korthikanti's 1T model on pp 64 (512 A100) reads 12% slow: the A100 "
                   "efficiencies are fitted on 35 A100 rows from three sources (docs/validation.md)")
def test_published_korthikanti_iteration_times():
    """Korthikanti et al. (2022) Table 4 iteration times within 5% MAPE."""
    kort = [p for p in _published().predictions if p.case.source_label.startswith("Korthikanti")
            and p.case.metric == "iteration_time_s" and p.status == "ok"]
    assert sum(abs(p.error_pct) for p in kort) / len(kort) <= 5.0


@pytest.mark.slow
def test_published_generalisation_bounds():
    """Issue 11's bounds for unseen runs, checked on the shipped CSV's held-out rows: dense time metrics
    <= 12% MAPE with >= 90% of dense time rows predicted; memory rows <= 12%."""
    from comet.validate.summary import STEP_RATE_METRICS, stats
    val = _published()
    dense = [p for p in val.predictions if p.case.metric in STEP_RATE_METRICS
             and (p.case.model is None or p.case.model.moe is None)]
    assert sum(p.status == "ok" for p in dense) / len(dense) >= 0.90
    assert stats([p for p in dense if p.case.held_out]).mape <= 12.0
    assert val.summary["memory"].mape <= 12.0


@pytest.mark.slow
def test_published_coverage_every_run_that_ran_fits():
    """Issue 11: on the shipped CSV no row is predicted infeasible (unstated memory knobs and layouts are
    filled by comet/validate/memory_knobs.py and layout.py) and >= 95% of the time rows are predicted."""
    cov = _published().summary["time_coverage"]
    assert cov["infeasible"] == 0 and cov["ok"] / cov["rows"] >= 0.95


@pytest.mark.slow
def test_published_target_time_mape():
    """Issue 11's targets on the shipped CSV: time metrics (iteration time, tokens/s, TFLOP/s, MFU) <= 8% MAPE,
    memory rows <= 10%."""
    val = _published()
    s = val.summary
    assert s["time_metrics"].mape <= 8.0 and s["memory"].mape <= 10.0


def test_fit_no_write_validates_with_the_fitted_values(tmp_path, capsys):
    """--fit --no-write leaves the YAML alone but scores the rows with the fitted values (not the old ones)."""
    import json
    import shutil
    from csvrows import row, write_csv
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(repo_root() / "cluster_specs" / "a100_dgx.yaml", specs)
    before = (specs / "a100_dgx.yaml").read_text()
    csv = write_csv(tmp_path / "f.csv", [row(), row(value="1.42", recompute="full", sequence_parallel="false"),
                                         row(metric="mfu", value="41.5", unit="%")])
    plain, fitted = tmp_path / "plain.json", tmp_path / "fitted.json"
    assert main(["validate", str(csv), "--quiet", "--specs", str(specs), "--json", str(plain)]) == 0
    assert main(["validate", str(csv), "--quiet", "--specs", str(specs), "--fit", "--no-write",
                 "--json", str(fitted)]) == 0
    assert (specs / "a100_dgx.yaml").read_text() == before
    p0 = [r["predicted"] for r in json.loads(plain.read_text())["rows"]]
    p1 = [r["predicted"] for r in json.loads(fitted.read_text())["rows"]]
    assert p0 != p1
