"""Mixture-of-experts and multi-head latent attention as data: the `moe:` and `mla:` sections of a model
YAML, and the expert-parallel rules of a parallel configuration (Megatron-Core's layout).

Shapes follow the released configs (HF config.json names in brackets):
  MoE  num_experts [n_routed_experts / num_local_experts], experts_per_token [num_experts_per_tok],
       expert_ffn_hidden [moe_intermediate_size], shared_experts [n_shared_experts],
       dense_layers [first_k_dense_replace], layer_freq [interleave_moe_layer_step / decoder_sparse_step].
  MLA  DeepSeek-V2 (arXiv:2405.04434) sec. 2.1.2-2.1.3: q_lora_rank, kv_lora_rank, qk_rope_head_dim,
       qk_nope_head_dim, v_head_dim.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from comet.config.loader import non_negative, positive
from comet.errors import ConfigError


@dataclass(frozen=True)
class MoESpec:
    num_experts: int = field(metadata=positive())           # routed experts per MoE layer
    experts_per_token: int = field(metadata=positive())     # top-k
    expert_ffn_hidden: int = field(metadata=positive())     # one routed expert's FFN width
    shared_experts: int = field(default=0, metadata=non_negative())
    shared_ffn_hidden: int | None = None                     # all shared experts together; None: shared * expert width
    dense_layers: int = field(default=0, metadata=non_negative())   # leading dense layers (first_k_dense_replace)
    layer_freq: int = field(default=1, metadata=positive())  # after them, every layer_freq-th layer is MoE

    def __post_init__(self):
        if self.experts_per_token > self.num_experts:
            raise ConfigError(f"experts_per_token ({self.experts_per_token}) must be <= num_experts "
                              f"({self.num_experts})", field="experts_per_token")
        if self.shared_ffn_hidden is None:
            object.__setattr__(self, "shared_ffn_hidden", self.shared_experts * self.expert_ffn_hidden)

    def is_moe_layer(self, index: int) -> bool:
        """Layer `index` (0-based) is MoE: past the leading dense layers, every layer_freq-th one, the last of
        each group (HF Llama 4: (i + 1) % interleave_moe_layer_step == 0; freq 1: every layer)."""
        if index < self.dense_layers:
            return False
        return (index - self.dense_layers + 1) % self.layer_freq == 0

    def moe_layer_count(self, layers: int) -> int:
        return sum(self.is_moe_layer(i) for i in range(layers))


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2 sec. 2.1): queries through a rank-q_lora_rank bottleneck
    (None: a plain projection), keys and values from one compressed latent of kv_lora_rank plus a shared
    rope key of qk_rope_head_dim."""
    kv_lora_rank: int = field(metadata=positive())
    qk_rope_head_dim: int = field(metadata=positive())
    qk_nope_head_dim: int = field(metadata=positive())
    v_head_dim: int = field(metadata=positive())
    q_lora_rank: int | None = None

    @property
    def q_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class Dispatcher(str, enum.Enum):
    """Megatron-Core --moe-token-dispatcher-type."""
    ALLTOALL = "alltoall"      # all-to-all over the EP group (also DeepEP's "flex")
    ALLGATHER = "allgather"    # all-gather tokens over EP (x ETP), reduce-scatter the outputs


def check_expert_parallel(par, model) -> None:
    """Megatron-Core's rules for ep / etp (parallel_state.initialize_model_parallel): the expert layers
    re-partition the same tp*cp*dp ranks of a pipeline stage as etp x ep x expert-dp, so
    etp*ep must divide tp*cp*dp; experts must split evenly over ep; each expert's FFN over etp."""
    # perf: plain tests, a message formatted only when its rule fails (every resolve runs these)
    moe = model.moe
    if moe is None:
        if not (par.ep == 1 and par.etp in (None, 1)):
            raise ConfigError(f"model {model.name} has no experts: ep and etp must be 1, got ep={par.ep}, "
                              f"etp={par.etp}", field="ep")
        return
    etp = par.expert_tp
    if not etp >= 1:
        raise ConfigError(f"must be >= 1, got {etp}", field="etp")
    if moe.num_experts % par.ep:
        raise ConfigError(f"num_experts ({moe.num_experts}) must be divisible by ep ({par.ep})", field="ep")
    if moe.expert_ffn_hidden % etp:
        raise ConfigError(f"expert_ffn_hidden ({moe.expert_ffn_hidden}) must be divisible by etp ({etp})", field="etp")
    if moe.shared_ffn_hidden and moe.shared_ffn_hidden % par.tp:
        raise ConfigError(f"shared expert ffn ({moe.shared_ffn_hidden}) must be divisible by tp ({par.tp})", field="tp")
    if par.ep > 1 and par.tp > 1 and not par.sp:
        raise ConfigError(f"expert parallelism (ep={par.ep}) with tensor parallelism (tp={par.tp}) needs sequence "
                          "parallelism (Megatron-Core arguments.py)", field="sequence_parallel")
    dense_ranks = par.tp * par.cp * par.dp
    if dense_ranks % (etp * par.ep):
        raise ConfigError(f"etp*ep = {etp}*{par.ep} = {etp * par.ep} must divide the ranks of a pipeline stage "
                          f"tp*cp*dp = {par.tp}*{par.cp}*{par.dp} = {dense_ranks} (Megatron-Core expert rank layout)",
                          field="ep")
    if not (par.moe_capacity_factor is None or par.moe_capacity_factor > 0):
        raise ConfigError(f"must be > 0 (or unset for dropless), got {par.moe_capacity_factor}",
                          field="moe_capacity_factor")
    if not par.moe_imbalance >= 1.0:
        raise ConfigError(f"is the busiest EP rank's routed tokens over the mean, must be >= 1, got {par.moe_imbalance}",
                          field="moe_imbalance")
    if not par.moe_imbalance <= par.ep:
        raise ConfigError(f"is the busiest EP rank's routed tokens over the mean, at most ep ({par.ep}), "
                          f"got {par.moe_imbalance}", field="moe_imbalance")
