"""Model specs: transformer shape as data (comet/models/*.yaml), looked up by zoo name or path."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from functools import cached_property
from importlib import resources
from pathlib import Path

from comet.config.loader import load, positive
from comet.config.moe import MLASpec, MoESpec
from comet.errors import ConfigError


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
    head_dim: int | None = None          # None: hidden / heads (Qwen3 and gpt-oss use wider / other heads)
    ffn_hidden: int | None = None        # None means 4 * hidden
    activation: Activation = Activation.GELU
    tied_embeddings: bool = True         # GPT/Megatron tie input embedding and logits weights
    # Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by (default 128) times tp
    # (megatron/training/tokenizer: _vocab_size_with_padding) so each TP shard is aligned; HF-style
    # stacks (torchtitan, llm-foundry) use the vocabulary as given: 1.
    vocab_pad_to: int = field(default=128, metadata=positive())
    linear_bias: bool = True             # GPT-2/3 and Megatron GPT have biases; Llama / Nemotron-4 do not
    source: str = ""                     # where the shape comes from
    moe: MoESpec | None = None           # mixture of experts (comet/config/moe.py); None: dense
    mla: MLASpec | None = None           # multi-head latent attention instead of MHA/GQA

    # perf: the derived sizes below are functools.cached_property values: the fields never change after
    # __post_init__ (frozen), and the builder, memory estimate and cost models read them ~200 times per
    # configuration (layer_params alone ~2 us). Stored in the instance dict: not fields, so equality,
    # hashing and repr are unchanged.

    # perf (i18g-glue): nearly every cache key of an evaluation holds the model; the generated hash walks
    # its 17 fields (and the MoE / MLA specs) in Python on each look-up (~0.35 us). The same value is kept
    # in the instance once computed; pickles and copies leave it out (string hashes differ between
    # processes).
    def __hash__(self) -> int:
        state = self.__dict__
        h = state.get("_hash")
        if h is None:
            h = state["_hash"] = hash(tuple([state[name] for name in _MODEL_FIELDS]))
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __post_init__(self):
        kv = self.heads if self.kv_heads is None else self.kv_heads
        ffn = 4 * self.hidden if self.ffn_hidden is None else self.ffn_hidden
        object.__setattr__(self, "activation", Activation(self.activation))
        object.__setattr__(self, "kv_heads", kv)
        object.__setattr__(self, "ffn_hidden", ffn)
        if self.head_dim is not None:
            if self.head_dim <= 0:
                raise ConfigError(f"must be > 0, got {self.head_dim}", field="head_dim")
        elif self.hidden % self.heads:
            raise ConfigError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})", field="hidden")
        if kv <= 0 or self.heads % kv:
            raise ConfigError(f"heads ({self.heads}) must be a multiple of kv_heads ({kv})", field="kv_heads")
        if ffn <= 0:
            raise ConfigError(f"must be > 0, got {ffn}", field="ffn_hidden")
        if self.moe is not None and self.moe.moe_layer_count(self.layers) == 0:
            raise ConfigError(f"no layer is a MoE layer (dense_layers {self.moe.dense_layers}, layer_freq "
                              f"{self.moe.layer_freq}, layers {self.layers})", field="moe.dense_layers")

    @cached_property
    def head_size(self) -> int:
        """Attention head dimension: head_dim when given, else hidden / heads."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @cached_property
    def q_hidden(self) -> int:
        """Width of the Q projection and of the attention output: heads * head_size."""
        return self.heads * self.head_size

    @cached_property
    def kv_hidden(self) -> int:
        """Width of the K (or V) projection: kv_heads * head_dim."""
        return self.kv_heads * self.head_size

    @cached_property
    def gated(self) -> bool:
        return self.activation.gated

    def padded_vocab(self, tp: int = 1) -> int:
        """Vocabulary rows of the embedding and logits as the framework allocates them: rounded up to a
        multiple of vocab_pad_to * tp (Megatron _vocab_size_with_padding)."""
        multiple = self.vocab_pad_to * tp if self.vocab_pad_to > 1 else 1
        return -(-self.vocab // multiple) * multiple

    @cached_property
    def attention_kind(self) -> str:
        return "mla" if self.mla else ("gqa" if self.kv_heads < self.heads else "mha")

    @cached_property
    def attention_params(self) -> int:
        """Attention weights of one layer (MLA: DeepSeek-V2 sec. 2.1; else QKV + output projection)."""
        h = self.hidden
        if self.mla:
            m, a = self.mla, self.heads
            q = h * a * m.q_head_dim if m.q_lora_rank is None else m.q_lora_rank * (h + a * m.q_head_dim + 1)
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * (a * (m.qk_nope_head_dim + m.v_head_dim) + 1)
            return q + kv + a * m.v_head_dim * h
        return h * (self.q_hidden + 2 * self.kv_hidden) + self.q_hidden * h

    @cached_property
    def layer_params(self) -> int:
        """Weights + biases of one dense transformer layer (attention, MLP, two norms)."""
        h, f = self.hidden, self.ffn_hidden
        mlp = h * f * (3 if self.gated else 2)
        biases = (((self.q_hidden + 2 * self.kv_hidden) + h + f * (2 if self.gated else 1) + h)
                  if self.linear_bias and not self.mla else 0)
        norms = 4 * h
        return self.attention_params + mlp + biases + norms

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and self.moe.is_moe_layer(index)

    def params_of_layer(self, index: int, active: bool = False) -> int:
        """Parameters of layer `index`; `active`: those one token uses (top-k routed experts)."""
        if not self.is_moe_layer(index):
            return self.layer_params
        m, h, mult = self.moe, self.hidden, (3 if self.gated else 2)
        routed = (m.experts_per_token if active else m.num_experts) * h * m.expert_ffn_hidden * mult
        return self.attention_params + 4 * h + h * m.num_experts + routed + h * m.shared_ffn_hidden * mult

    @cached_property
    def embedding_params(self) -> int:
        """Token embedding as allocated (padded vocabulary at tp 1; position embeddings, seq_len x
        hidden, are negligible and not counted)."""
        return self.padded_vocab() * self.hidden

    @cached_property
    def params(self) -> int:
        """Total parameters; an untied output layer adds another vocab x hidden matrix."""
        head = 0 if self.tied_embeddings else self.embedding_params
        return self.body_params() + self.embedding_params + head + 2 * self.hidden

    @cached_property
    def active_params(self) -> int:
        """Parameters one token passes through (MoE: top-k routed experts, not all of them)."""
        head = 0 if self.tied_embeddings else self.embedding_params
        return self.body_params(active=True) + self.embedding_params + head + 2 * self.hidden

    def body_params(self, active: bool = False) -> int:
        if self.moe is None:
            return self.layers * self.layer_params
        return sum(self.params_of_layer(i, active) for i in range(self.layers))

    def validate_supported(self) -> None:
        """Every parsed feature is modelled; kept as the hook where a parsed-but-unmodelled one is refused."""


_MODEL_FIELDS = tuple(f.name for f in fields(ModelSpec))   # what the generated hash reads, in order


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
