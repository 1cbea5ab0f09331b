"""The Python API: comet.estimate / comet.search return what the CLI prints, and `import comet` is light."""

import json
import subprocess
import sys

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import comet
from comet.api import _plain_values
from comet.cli import main
from comet.config.parallel import Recompute, Schedule

FLAGSHIP = dict(gpus=1024, tp=8, pp=8, global_batch=1536, recompute="selective")


def test_import_is_light(repo_root):
    code = "import sys, comet; print([m for m in ('ray', 'optuna', 'matplotlib', 'pandas') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root, check=True)
    assert out.stdout.strip() == "[]"


def test_version_flag(capsys):
    # main() turns argparse's SystemExit into its return code (the CLI's last-resort handler wraps it)
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"comet {comet.__version__}"


def test_estimate_matches_cli(capsys):
    res = comet.estimate("gpt3_175b", **FLAGSHIP)
    assert res.feasible
    assert main(["estimate", "--model", "gpt3_175b", "--gpus", "1024", "--tp", "8", "--pp", "8",
                 "--global-batch", "1536", "--recompute", "selective", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["step_time_s"] == res.step_time_s and cli["label"] == res.label
    frame = res.to_frame()
    assert isinstance(frame, pd.DataFrame) and len(frame) == 1
    assert frame["step_time_s"].iloc[0] == res.step_time_s
    assert frame[[f"breakdown.{k}" for k in comet.result.BREAKDOWN_KEYS]].sum(axis=1).iloc[0] == \
        pytest.approx(res.step_time_s)


def test_estimate_infeasible_names_a_reevaluated_remedy():
    res = comet.estimate("gpt3_175b", gpus=64, tp=8, global_batch=64)
    assert res.status is comet.CandidateStatus.INFEASIBLE and "HBM holds 80 GB" in res.reason
    remedies = res.extra["remedies"]
    assert remedies, "a 175B model fits 64 H100s with more pipeline stages or ZeRO-3"
    for r in remedies:   # each suggestion is a configuration that really evaluates as feasible
        params = dict(FLAGSHIP, gpus=64, global_batch=64)
        again = comet.estimate("gpt3_175b", **{**params, **_fields(r["label"])})
        assert again.feasible and again.step_time_s == pytest.approx(r["step_time_s"])


def _fields(label: str) -> dict:
    """tp8-pp4-dp2-mb1-none-z1-bf16 -> the fields it names."""
    parts = label.split("-")
    out = {"tp": int(parts[0][2:]), "pp": int(parts[1][2:]), "micro_batch": int(parts[3][2:]),
           "recompute": parts[4], "zero": int(parts[5][1:]), "precision": parts[6]}
    return out


def test_estimate_bad_argument_raises_config_error():
    with pytest.raises(comet.ConfigError, match="tp: must be > 0"):
        comet.estimate("gpt3_175b", gpus=64, tp=0, global_batch=64)
    with pytest.raises(comet.ConfigError, match="unknown argument"):
        comet.estimate("gpt3_175b", gpus=64, tensor_parallel=8, global_batch=64)
    with pytest.raises(comet.ConfigError, match="recompute: must be one of"):
        comet.estimate("gpt3_175b", gpus=64, tp=8, recompute="most", global_batch=64)
    with pytest.raises(comet.ConfigError, match="vpp: must be an integer, got '2'"):
        comet.estimate("gpt3_175b", gpus=64, tp=8, pp=8, vpp="2", global_batch=64)


def test_search_from_dict_returns_frames(tmp_path, repo_root):
    space = {"study": "api_tiny", "model": "gpt_1_7b", "job": {"global_batch": 16, "total_tokens": 1e9},
             "cluster": {"spec": str(repo_root / "cluster_specs/h100_dgx.yaml"), "gpus": [8, 16]},
             "parallel": {"tp": [1, 2], "pp": [1, 2]}, "objectives": [{"time_to_train": "min"},
                                                                      {"cost_per_run": "min"}],
             "timelines": 0}
    out = comet.search(space, out=tmp_path / "study", executor="serial")
    assert isinstance(out.candidates, pd.DataFrame) and isinstance(out.pareto, pd.DataFrame)
    assert len(out.candidates) == 8 and (out.candidates["status"] == "ok").all()
    assert set(out.pareto["key"]) <= set(out.candidates["key"]) and len(out.pareto) >= 1
    assert (tmp_path / "study" / "candidates.parquet").is_file()


_VALUES = st.one_of(st.integers(-5, 5000), st.floats(allow_nan=False), st.text(max_size=4), st.booleans(), st.none(),
                    st.sampled_from(list(Recompute) + list(Schedule)), st.lists(st.sampled_from(["optimizer"]), max_size=2))


@settings(max_examples=300, deadline=None)
@given(params=st.dictionaries(st.sampled_from(["tp", "pp", "gpus", "recompute", "schedule", "offload", "cp"]), _VALUES))
def test_plain_values_fast_path_equals_the_comprehension(params):
    # comet.api._plain_values copies a dict of plain values as is; anything else goes through the comprehension
    reference = {k: (v.value if hasattr(v, "value") else v) for k, v in params.items() if v is not None}
    out = _plain_values(params)
    assert out == reference and list(out) == list(reference) and out is not params
    assert all(type(out[k]) is type(reference[k]) for k in out)
