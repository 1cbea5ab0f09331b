"""The model zoo: every file loads, shapes match the published tables, sizes match the published counts."""

from __future__ import annotations

import csv
from importlib import resources
from pathlib import Path

import pytest

from comet.config.loader import load
from comet.config.model import Activation, ModelSpec, load_model, zoo_names
from comet.errors import ConfigError

PUBLISHED = Path(__file__).resolve().parents[2] / ".." / "shared" / "calibration" / "published.csv"
MOE = {"mixtral_8x7b"}


def _zoo_file(name: str) -> Path:
    return Path(str(resources.files("comet.models") / f"{name}.yaml"))


def _dense_zoo() -> dict[str, ModelSpec]:
    return {name: load_model(name) for name in zoo_names() if name not in MOE}


def _published_rows() -> list[dict]:
    if not PUBLISHED.is_file():
        pytest.skip("../shared/calibration/published.csv not found")
    with PUBLISHED.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", zoo_names())
def test_every_zoo_file_loads_and_cites_its_source(name):
    path = _zoo_file(name)
    spec = load(ModelSpec, path)                       # raw load: MoE files parse too
    assert spec.name == name, f"{path.name}: name field {spec.name!r} differs from the file name"
    assert name == name.lower() and " " not in name
    assert spec.source, f"{path.name}: empty source"
    assert path.read_text().startswith("#"), f"{path.name}: first line must be a comment citing the shape"
    if name not in MOE:
        assert load_model(name) == spec


@pytest.mark.parametrize("name, published, tolerance", [
    ("gpt3_175b", 175e9, 0.02),      # Brown et al. 2020
    ("gpt3_1t", 1008e9, 0.02),       # Narayanan SC21 Table 1 (1008.0B)
    ("llama2_70b", 70e9, 0.03),      # Touvron et al. 2023 (68.98B exactly; "70B" nominal)
    ("llama3_405b", 405e9, 0.02),    # Llama 3 Herd of Models, Table 3
    ("llama3_8b", 8.03e9, 0.02),
    ("llama2_7b", 6.74e9, 0.02),
])
def test_parameter_count_matches_published_size(name, published, tolerance):
    params = load_model(name).params
    assert abs(params / published - 1) < tolerance, f"{name}: {params / 1e9:.2f}B vs {published / 1e9:.2f}B"


def _same_shape(spec: ModelSpec, row: dict) -> bool:
    shape = (spec.layers, spec.hidden, spec.heads, spec.seq_len, spec.vocab)
    if shape != tuple(int(row[k]) for k in ("layers", "hidden", "heads", "seq_len", "vocab")):
        return False
    return not row["ffn_hidden"] or spec.ffn_hidden == int(row["ffn_hidden"])


def test_every_published_model_has_a_zoo_entry_with_its_shape_and_size():
    zoo = _dense_zoo()
    missing, wrong_size = [], []
    for row in _published_rows():
        matches = [spec for spec in zoo.values() if _same_shape(spec, row)]
        if not matches:
            missing.append(row["model"])
            continue
        published = float(row["params_b"]) * 1e9
        if not any(abs(spec.params / published - 1) < 0.05 for spec in matches):
            wrong_size.append(f"{row['model']}: {[f'{s.name} {s.params / 1e9:.2f}B' for s in matches]}")
    assert not missing, f"published models without a zoo entry: {sorted(set(missing))}"
    assert not wrong_size, f"zoo sizes more than 5% off the published count: {wrong_size}"


def test_llama_shapes_use_swiglu_gqa_and_untied_embeddings():
    for name in ("llama2_70b", "llama3_8b", "llama3_70b", "llama3_405b"):
        spec = load_model(name)
        assert spec.activation is Activation.SWIGLU and spec.kv_heads == 8 and not spec.tied_embeddings
    assert load_model("llama2_7b").kv_heads == 32            # MHA below 70B in Llama 2
    assert (load_model("llama3_405b").layers, load_model("llama3_405b").hidden) == (126, 16384)


def test_unknown_model_name_is_a_config_error_listing_the_zoo():
    with pytest.raises(ConfigError) as info:
        load_model("gpt5_17t")
    message = str(info.value)
    assert "gpt5_17t" in message
    for name in ("gpt3_175b", "llama3_405b", "mpt_7b"):
        assert name in message


def test_mixture_of_experts_file_loads_with_its_experts():
    spec = load_model("mixtral_8x7b")
    assert (spec.moe.num_experts, spec.moe.experts_per_token, spec.moe.expert_ffn_hidden) == (8, 2, 14336)


@pytest.mark.parametrize("name", zoo_names())
def test_cached_sizes_are_invisible_and_follow_replace(name):
    """ModelSpec's derived sizes are cached on the instance: reading them changes neither equality,
    hashing nor repr, and a replaced copy computes its own."""
    import dataclasses
    model = load_model(name)
    fresh = load_model(name)
    derived = ("head_size", "q_hidden", "kv_hidden", "gated", "attention_kind", "attention_params",
               "layer_params", "embedding_params", "params", "active_params")
    values = {d: getattr(model, d) for d in derived}
    assert model == fresh and hash(model) == hash(fresh) and repr(model) == repr(fresh)
    wider = dataclasses.replace(model, hidden=2 * model.hidden, head_dim=model.head_size)
    assert wider.layer_params != values["layer_params"]
    assert wider.layer_params == dataclasses.replace(fresh, hidden=2 * fresh.hidden, head_dim=fresh.head_size).layer_params
    assert {d: getattr(model, d) for d in derived} == values
