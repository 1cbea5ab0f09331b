"""Model specs: transformer shape as data (comet/models/*.yaml), looked up by zoo name or path."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from comet.config.loader import load, positive
from comet.errors import ConfigError, UnsupportedError


class Activation(str, enum.Enum):
    GELU = "gelu"
    SWIGLU = "swiglu"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int = field(metadata=positive())
    hidden: int = field(metadata=positive())
    heads: int = field(metadata=positive())
    vocab: int = field(metadata=positive())
    seq_len: int = field(metadata=positive())
    kv_heads: int | None = None          # grouped-query attention; None means = heads (MHA)
    ffn_hidden: int | None = None        # None means 4 * hidden
    activation: Activation = Activation.GELU
    tied_embeddings: bool = True         # GPT/Megatron tie input embedding and logits weights
    source: str = ""                     # where the shape comes from
    # Mixture of experts: parsed so a MoE file loads, rejected by validate_supported().
    num_experts: int = 1
    experts_per_token: int = 1

    def __post_init__(self):
        kv = self.heads if self.kv_heads is None else self.kv_heads
        ffn = 4 * self.hidden if self.ffn_hidden is None else self.ffn_hidden
        object.__setattr__(self, "activation", Activation(self.activation))
        object.__setattr__(self, "kv_heads", kv)
        object.__setattr__(self, "ffn_hidden", ffn)
        if self.hidden % self.heads:
            raise ConfigError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})", field="hidden")
        if kv <= 0 or self.heads % kv:
            raise ConfigError(f"heads ({self.heads}) must be a multiple of kv_heads ({kv})", field="kv_heads")
        if ffn <= 0:
            raise ConfigError(f"must be > 0, got {ffn}", field="ffn_hidden")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of the K (or V) projection: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def gated(self) -> bool:
        return self.activation is Activation.SWIGLU

    @property
    def layer_params(self) -> int:
        """Weights + biases of one transformer layer (QKV, output projection, MLP, two norms)."""
        h, f = self.hidden, self.ffn_hidden
        attn = h * (h + 2 * self.kv_hidden) + h * h
        mlp = h * f * (3 if self.gated else 2)
        biases = (h + 2 * self.kv_hidden) + h + f * (2 if self.gated else 1) + h
        norms = 4 * h
        return attn + mlp + biases + norms

    @property
    def embedding_params(self) -> int:
        """Token embedding (position embeddings, seq_len x hidden, are negligible and not counted)."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Total parameters; an untied output layer adds another vocab x hidden matrix."""
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.layers * self.layer_params + self.embedding_params + head + 2 * self.hidden

    def validate_supported(self) -> None:
        if self.num_experts > 1:
            raise UnsupportedError(
                f"model {self.name}: mixture of experts (num_experts={self.num_experts}) is not supported yet")


def zoo_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("comet.models").iterdir() if p.name.endswith(".yaml"))


def load_model(name_or_path: str) -> ModelSpec:
    """A zoo name (e.g. `gpt3_175b`) or a path to a model YAML file."""
    path = Path(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")) or path.exists():
        spec = load(ModelSpec, path)
    else:
        res = resources.files("comet.models") / f"{name_or_path}.yaml"
        if not res.is_file():
            raise ConfigError(f"unknown model '{name_or_path}' (zoo: {', '.join(zoo_names())}; or give a YAML path)",
                              field="model")
        with resources.as_file(res) as p:
            spec = load(ModelSpec, p)
    spec.validate_supported()
    return spec
