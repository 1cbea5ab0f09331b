"""The strict YAML loader: one clear line naming file and field for every kind of bad input."""

import pytest

from comet.config.cluster import load_cluster
from comet.config.model import load_model
from comet.errors import ConfigError

H100 = "cluster_specs/h100_dgx.yaml"


def write(tmp_path, text, name="x.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def cluster_text(repo_root):
    return (repo_root / H100).read_text()


def test_h100_spec_loads_with_datasheet_numbers(h100):
    assert h100.gpu.peak_tflops["bf16"] == pytest.approx(989.4)
    assert h100.gpu.hbm_bandwidth == pytest.approx(3.35e12)
    assert [d.size for d in h100.network] == [8, 0]
    assert h100.network[0].bandwidth == pytest.approx(450e9)


def test_unknown_key_names_file_and_path(tmp_path, repo_root):
    p = write(tmp_path, cluster_text(repo_root).replace("    latency_us: 14.0", "    latency_us: 14.0\n    colour: red"))
    with pytest.raises(ConfigError, match=r"x\.yaml: network\[1\]\.colour: unknown key"):
        load_cluster(p)


def test_bad_value_names_rule_and_value(tmp_path, repo_root):
    p = write(tmp_path, cluster_text(repo_root).replace("bandwidth_GBps: 50", "bandwidth_GBps: -5"))
    with pytest.raises(ConfigError, match=r"x\.yaml: network\[1\]\.bandwidth_GBps: must be > 0, got -5"):
        load_cluster(p)


def test_missing_key(tmp_path):
    p = write(tmp_path, "name: m\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 100\n")
    with pytest.raises(ConfigError, match=r"x\.yaml: seq_len: missing required key"):
        load_model(p)


def test_malformed_yaml_reports_line(tmp_path):
    p = write(tmp_path, "name: m\nlayers: [2\n")
    with pytest.raises(ConfigError, match=r"x\.yaml: malformed YAML at line 3"):
        load_model(p)


def test_wrong_type_and_enum(tmp_path):
    p = write(tmp_path, "name: m\nlayers: two\nhidden: 64\nheads: 4\nvocab: 100\nseq_len: 8\n")
    with pytest.raises(ConfigError, match="layers: must be an integer, got 'two'"):
        load_model(p)
    p = write(tmp_path, "name: m\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 100\nseq_len: 8\nactivation: relu\n")
    with pytest.raises(ConfigError, match="activation: must be one of gelu, swiglu, geglu, squared_relu, got 'relu'"):
        load_model(p)


def test_missing_file_and_not_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_cluster(str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_model(write(tmp_path, "- 1\n- 2\n"))


def test_cluster_spec_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_cluster("h100_dgx").gpu.sms == 132
    assert load_cluster("cluster_specs/a100_dgx.yaml").gpu.sms == 108
    with pytest.raises(ConfigError, match="unknown cluster spec 'nope' \\(known: a100_dgx, (.*, )?h100_dgx"):
        load_cluster("nope")


def test_base_spec_gives_what_a_variant_leaves_out(tmp_path, repo_root):
    """A variant names its base and replaces keys: mappings merge key by key, lists (network) whole."""
    write(tmp_path, cluster_text(repo_root), name="base.yaml")
    p = write(tmp_path, "base: base.yaml\nname: variant\ngpu:\n  name: slower part\n  hbm_GB: 141\n", name="v.yaml")
    base, variant = load_cluster(tmp_path / "base.yaml"), load_cluster(p)
    assert (variant.name, variant.gpu.name, variant.gpu.hbm_GB) == ("variant", "slower part", 141)
    assert variant.gpu.peak_tflops == base.gpu.peak_tflops          # merged, not replaced
    assert (variant.efficiency, variant.network, variant.cost) == (base.efficiency, base.network, base.cost)


def test_shipped_variants_read_the_fitted_efficiencies_of_their_base(repo_root):
    base = load_cluster(repo_root / "cluster_specs" / "h100_dgx.yaml")
    for name in ("h100_a3mega.yaml", "h800_hgx.yaml"):
        variant = load_cluster(repo_root / "cluster_specs" / name)
        assert (variant.efficiency, variant.cost, variant.power) == (base.efficiency, base.cost, base.power)
        assert variant.network != base.network


@pytest.mark.parametrize("text, rule", [("base: missing.yaml\n", "not found"), ("base: v.yaml\n", "cycle"),
                                        ("base: [1]\n", "must name")])
def test_bad_base_is_one_line_naming_the_field(tmp_path, text, rule):
    p = write(tmp_path, text, name="v.yaml")
    with pytest.raises(ConfigError, match=rf"v\.yaml: base: .*{rule}"):
        load_cluster(p)
