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
    SWIGLU = "swiglu"               # gated: SiLU(x W_gate) * (x W_up) (Shazeer 2020; Llama)
    GEGLU = "geglu"                 # gated: GeLU(x W_gate) * (x W_up) (Shazeer 2020; Gemma)
    SQUARED_RELU = "squared_relu"   # ReLU(x)^2, not gated (So et al. 2021 Primer; Nemotron-4 sec. 2)

    @property
    def gated(self) -> bool:
        """Gated MLPs have two input projections (gate and up) of width ffn_hidden each."""
        return self in (Activation.SWIGLU, Activation.GEGLU)


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
    # Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by (default 128) times tp
    # (megatron/training/tokenizer: _vocab_size_with_padding) so each TP shard is aligned; HF-style
    # stacks (torchtitan, llm-foundry) use the vocabulary as given: 1.
    vocab_pad_to: int = field(default=128, metadata=positive())
    linear_bias: bool = True             # GPT-2/3 and Megatron GPT have biases; Llama / Nemotron-4 do not
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
        return self.activation.gated

    def padded_vocab(self, tp: int = 1) -> int:
        """Vocabulary rows of the embedding and logits as the framework allocates them: rounded up to a
        multiple of vocab_pad_to * tp (Megatron _vocab_size_with_padding)."""
        multiple = self.vocab_pad_to * tp if self.vocab_pad_to > 1 else 1
        return -(-self.vocab // multiple) * multiple

    @property
    def layer_params(self) -> int:
        """Weights + biases of one transformer layer (QKV, output projection, MLP, two norms)."""
        h, f = self.hidden, self.ffn_hidden
        attn = h * (h + 2 * self.kv_hidden) + h * h
        mlp = h * f * (3 if self.gated else 2)
        biases = ((h + 2 * self.kv_hidden) + h + f * (2 if self.gated else 1) + h) if self.linear_bias else 0
        norms = 4 * h
        return attn + mlp + biases + norms

    @property
    def embedding_params(self) -> int:
        """Token embedding as allocated (padded vocabulary at tp 1; position embeddings, seq_len x
        hidden, are negligible and not counted)."""
        return self.padded_vocab() * self.hidden

    @property
    def params(self) -> int:
        """Total parameters; an untied output layer adds another vocab x hidden matrix."""
        head = 0 if self.tied_embeddings else self.embedding_params
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
