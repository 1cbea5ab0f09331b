"""Search-space YAML: every shipped space loads; bad files give one line naming file and key, exit 2."""

from __future__ import annotations

import pytest

from comet.cli import main
from comet.errors import ConfigError
from comet.search.space import Method, Metric, grid_size, load_space, parse_space

from search_fakes import ROOT


@pytest.mark.parametrize("name", ["tiny", "gpt3_175b", "gpt3_1t"])
def test_shipped_spaces_load(name):
    space = load_space(ROOT / "search_spaces" / f"{name}.yaml")
    assert space.study == name
    assert space.objectives and grid_size(space) > 0
    assert (ROOT / space.cluster_spec).exists() or __import__("os").path.exists(space.cluster_spec)


def test_tiny_space_values(tiny_raw):
    space = parse_space(tiny_raw, "search_spaces/tiny.yaml")
    axes = {a.name: a.values for a in space.axes}
    assert axes["cluster.gpus"] == (64, 128)
    assert axes["parallel.recompute"] == ("selective", "full")
    assert axes["parallel.micro_batch"] == (1,)           # a scalar is one value
    assert space.job.total_tokens == 300e9                # "300e9" (a YAML 1.1 string) read as a number
    assert [o.metric for o in space.objectives] == [Metric.TIME_TO_TRAIN, Metric.COST_PER_RUN]
    assert grid_size(space) == 32


def test_optuna_short_forms(tiny_raw):
    tiny_raw.update(method="optuna-tpe", budget={"trials": 5})
    tiny_raw["parallel"]["micro_batch"] = {"low": 1, "high": 8, "log": True}
    tiny_raw["parallel"]["tp"] = {"choices": [2, 4, 8]}
    space = parse_space(tiny_raw, "x.yaml")
    axes = {a.name: a for a in space.axes}
    assert axes["parallel.micro_batch"].range.log and axes["parallel.micro_batch"].range.integer
    assert axes["parallel.tp"].values == (2, 4, 8)
    assert space.method is Method.OPTUNA_TPE


def test_offload_values(tiny_raw):
    tiny_raw["parallel"]["offload"] = ["none", "optimizer", ["optimizer", "activations"], "weights+optimizer"]
    axis = next(a for a in parse_space(tiny_raw, "x.yaml").parallel if a.short == "offload")
    assert axis.values == ("none", "optimizer", "optimizer+activations", "weights+optimizer")


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["parallel"].update(tp=[2, 4, -1]), "x.yaml: parallel.tp[2]: must be > 0, got -1"),
    (lambda r: r["parallel"].update(tpp=[2]), "x.yaml: parallel.tpp: unknown key"),
    (lambda r: r.update(colour="red"), "x.yaml: colour: unknown key"),
    (lambda r: r["parallel"].update(recompute=["some"]), "x.yaml: parallel.recompute[0]: must be one of none, selective, full"),
    (lambda r: r["cluster"].update(oversubscription=[0.5]), "x.yaml: cluster.oversubscription[0]: must be >= 1"),
    (lambda r: r["parallel"].update(tp={"low": 1, "high": 8}), "x.yaml: parallel.tp: a {low, high} range cannot be enumerated by method grid"),
    (lambda r: r.update(method="optuna-tpe"), "x.yaml: budget: method optuna-tpe needs budget.trials"),
    (lambda r: r.update(objectives=[{"speed": "min"}]), "x.yaml: objectives[0]: must be one of step_time"),
    (lambda r: r.update(objectives=[{"mfu": "up"}]), "x.yaml: objectives[0].mfu: must be one of min, max"),
    (lambda r: r["job"].update(global_batch=0), "x.yaml: job.global_batch: must be > 0, got 0"),
    (lambda r: r.pop("model"), "x.yaml: model: missing required key"),
    (lambda r: r.update(study="a b"), "x.yaml: study: must be a plain name"),
    (lambda r: r.update(base={"build": {"tq": 8}}), "x.yaml: base.build.tq: unknown key"),
])
def test_bad_values_name_file_and_key(tiny_raw, edit, message):
    edit(tiny_raw)
    with pytest.raises(ConfigError) as info:
        parse_space(tiny_raw, "x.yaml")
    assert str(info.value).startswith(message), str(info.value)


def _cli_error(capsys, path) -> tuple[int, str]:
    code = main(["search", str(path), "--executor", "serial"])
    err = capsys.readouterr().err
    return code, err


def test_cli_malformed_yaml(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("study: x\nparallel: [tp: 1\n")
    code, err = _cli_error(capsys, path)
    assert code == 2
    assert err.count("\n") == 1 and "bad.yaml: malformed YAML at line" in err


def test_cli_unknown_key(tiny_raw, write_space, capsys):
    tiny_raw["parallel"]["pipeline"] = [2]
    code, err = _cli_error(capsys, write_space(tiny_raw, "unknown.yaml"))
    assert code == 2
    assert err.count("\n") == 1 and "unknown.yaml: parallel.pipeline: unknown key" in err


def test_cli_bad_value(tiny_raw, write_space, capsys):
    tiny_raw["parallel"]["tp"] = [2, 4, -1]
    code, err = _cli_error(capsys, write_space(tiny_raw, "badvalue.yaml"))
    assert code == 2
    assert err.strip().endswith("badvalue.yaml: parallel.tp[2]: must be > 0, got -1")


def test_cli_missing_cluster_spec(tiny_raw, tmp_path, capsys):
    import yaml
    tiny_raw["cluster"]["spec"] = "nowhere/cluster.yaml"
    path = tmp_path / "nospec.yaml"
    path.write_text(yaml.safe_dump(tiny_raw))
    code, err = _cli_error(capsys, path)
    assert code == 2 and "nospec.yaml: cluster.spec: cluster spec not found" in err and err.count("\n") == 1


def test_cli_missing_file(capsys):
    code, err = _cli_error(capsys, "no/such/space.yaml")
    assert code == 2 and "no/such/space.yaml: file not found" in err


def test_full_example_in_docs_parses():
    import re

    import yaml
    text = (ROOT / "docs" / "search-space.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    space = parse_space(yaml.safe_load(block), str(ROOT / "search_spaces" / "doc-example.yaml"))
    axes = {a.name: a.values for a in space.axes}
    assert axes["parallel.dp"] == (None,) and axes["parallel.sequence_parallel"] == (None,)
    assert axes["parallel.offload"][-1] == "optimizer+activations"
    assert space.cost == {"network_usd_per_GBps": [8.0, 60.0]} and space.budget.trials == 500


def test_cli_trace_base_not_available_is_one_line(tiny_raw, write_space, capsys):
    tiny_raw["base"] = {"trace": "some/trace.json"}
    code, err = _cli_error(capsys, write_space(tiny_raw, "tracebase.yaml"))
    assert code == 2 and err.count("\n") == 1 and "base.trace" in err
