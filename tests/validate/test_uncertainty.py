"""The expected error band comes from the validation residuals by regime; small regimes fall back."""

from comet.validate.uncertainty import MIN_ROWS, error_band, write_bands


def _summary(prec_n: int):
    s = lambda n, m: {"n": n, "mape_pct": m, "max_abs_error_pct": m * 2, "bias_pct": 0.0}  # noqa: E731
    return {"time_metrics": s(100, 6.0), "by_precision": {"fp8": s(prec_n, 9.5), "bf16": s(50, 4.0)},
            "by_scale": {">1024 GPUs": s(30, 7.0)}, "by_model_size": {}, "by_framework": {}}


def test_band_takes_the_least_certain_matching_regime(tmp_path):
    path = write_bands(_summary(40), "m.csv", tmp_path / "b.json")
    band = error_band("fp8", 2048, 70e9, path=path)
    assert band.pct == 9.5 and "precision fp8" in band.basis
    assert error_band("bf16", 16, 70e9, path=path).pct == 6.0          # overall beats bf16's 4%
    assert error_band("bf16", 2048, None, path=path).pct == 7.0


def test_small_regimes_and_no_validation(tmp_path):
    path = write_bands(_summary(MIN_ROWS - 1), "m.csv", tmp_path / "b.json")
    assert error_band("fp8", 16, 1e9, path=path).pct == 6.0
    assert error_band("fp8", 16, 1e9, path=tmp_path / "absent.json") is None
