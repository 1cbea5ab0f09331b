"""Parallel configuration (how the model is run) and the rules that make one valid."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields

from comet.config.frozen import replace_fields
from comet.config.loader import positive
from comet.config.model import ModelSpec
from comet.config.moe import Dispatcher, check_expert_parallel
from comet.config.stages import chunk_layer_counts
from comet.errors import ConfigError


class Schedule(str, enum.Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved_1f1b"


class Recompute(str, enum.Enum):
    NONE = "none"
    SELECTIVE = "selective"   # Korthikanti et al. 2022: recompute the attention core only
    FULL = "full"             # recompute each layer's forward before its backward


class SelectivePolicy(str, enum.Enum):
    """What `recompute: selective` keeps, as each stack implements it."""
    ATTENTION = "attention"   # Megatron / Korthikanti: recompute the attention core only
    OP_SAC = "op_sac"         # torchtitan per-op SAC: keep SDPA outputs and every second matmul output
    SAVE_QKV = "save_qkv"     # MaxText remat_policy save_qkv_proj: keep the layer input and Q/K/V only


class RecomputeModule(str, enum.Enum):
    """Megatron-Core `--recompute-modules` (megatron/core/transformer/transformer_config.py, mcore >= 0.12)
    re-run besides the attention core under `recompute: selective`. Each frees the tensors its module
    saves for backward (CheckpointWithoutOutput) and re-runs the module before the backward needs them;
    a module the layer does not have is ignored, as Megatron-Core does (comet/workload/recompute_modules.py)."""
    LAYERNORM = "layernorm"       # input / pre-MLP norms that are separate modules (MLA input, MoE pre-MLP)
    MLA_UP_PROJ = "mla_up_proj"   # MLA query / key-value up projections and RoPE
    MOE_ACT = "moe_act"           # the routed experts' activation function


class Precision(str, enum.Enum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"               # FP8 GEMMs (Transformer Engine), BF16 elsewhere


class OffloadTarget(str, enum.Enum):
    OPTIMIZER = "optimizer"       # FP32 master weights + Adam moments live in the expansion tier
    WEIGHTS = "weights"           # parameters streamed in per layer
    ACTIVATIONS = "activations"   # saved activations offloaded between forward and backward


# Gradient bytes on the wire per reduce dtype. Megatron's default is fp32 (arguments.py: bf16 implies
# accumulate_allreduce_grads_in_fp32); NeMo recipes reduce in bf16.
REDUCE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# Gradient-accumulation steps per optimizer step. Published runs use ~10^3 (Llama 3 405B: 16M-token
# batches of 8,192-token sequences = 2,048 sequences; Dubey et al. 2024, Table 4); 65,536 is 30x that
# and bounds the replay's memory, which grows linearly with the micro-batch count.
MAX_MICROBATCHES = 65_536


@dataclass(frozen=True)
class ParallelConfig:
    global_batch: int = field(metadata=positive())
    tp: int = field(default=1, metadata=positive())
    pp: int = field(default=1, metadata=positive())
    dp: int | None = None                      # derived from gpus when omitted
    cp: int = field(default=1, metadata=positive())
    gpus: int | None = None
    sequence_parallel: bool | None = None      # None: on whenever tp > 1 (Megatron-Core default)
    vpp: int = field(default=1, metadata=positive())
    schedule: Schedule = Schedule.ONE_F_ONE_B
    micro_batch: int = field(default=1, metadata=positive())
    recompute: Recompute = Recompute.NONE
    selective_policy: SelectivePolicy = SelectivePolicy.ATTENTION
    # Megatron-Core modules recomputed as well under recompute: selective with the attention policy
    recompute_modules: tuple[RecomputeModule, ...] = ()
    zero: int = 1                              # 0..3; Megatron's distributed optimizer is stage 1
    precision: Precision = Precision.BF16
    overlap_grad_reduce: bool = True           # DP reduce-scatter/all-reduce overlaps backward
    overlap_param_gather: bool = True          # ZeRO param all-gather overlaps the next forward
    overlap_p2p_comm: bool = False             # interleaved pipeline sends overlap compute (Megatron overlap_p2p_comm)
    overlap_tp_comm: bool = False              # TP collectives split and pipelined with their GEMMs
    flash_attention: bool = True               # fused attention (else unfused bmm + softmax kernels)
    # Which flash-attention kernels: fused (Transformer Engine / cuDNN / FlashAttention-3 on Hopper) or fa2
    # (PyTorch SDPA's flash backend, the flash-attn 2 package; comet/hardware/compute.py attention_time_s)
    attention_kernel: str = "fused"
    # Q, K, V gathered into flash-attn's packed (varlen) layout and the output scattered back, in every
    # layer (flash_attn.bert_padding unpad_input / pad_input, as llm-foundry's flash_attn_fn calls them):
    # memory-bound copies around the attention kernel (comet/workload/layers.py unpad_copies)
    attention_unpad: bool = False
    offload: tuple[OffloadTarget, ...] = ()
    # Mixture of experts (comet/config/moe.py; Megatron-Core names in brackets)
    ep: int = field(default=1, metadata=positive())           # expert parallel [--expert-model-parallel-size]
    etp: int | None = None                                    # expert tensor parallel; None = tp [--expert-tensor-parallel-size]
    moe_dispatcher: Dispatcher = Dispatcher.ALLTOALL          # [--moe-token-dispatcher-type]
    moe_capacity_factor: float | None = None                  # None: dropless [--moe-expert-capacity-factor]
    moe_imbalance: float = 1.0                                # busiest EP rank's routed tokens / mean (1 = balanced)
    moe_overlap_a2a: bool = False                             # dispatch/combine hidden by the other micro-batch's
                                                              # compute [--overlap-moe-expert-parallel-comm, DeepEP]
    grad_dtype: str = "fp32"                   # gradients accumulated / reduced in: fp32 (Megatron default) or bf16
    # dtype of the data-parallel gradient reduction where it differs from grad_dtype (None: the same):
    # PyTorch FSDP MixedPrecision.reduce_dtype (Composer PURE: bf16, DEFAULT: fp32), DeepSpeed
    # communication_data_type (default: the model's fp16 / bf16) while its fp32 gradient partitions stay
    reduce_dtype: str | None = None
    fp8_impl: str = "te"                       # te: Transformer Engine (FP8 weight caches, FP8 saved inputs);
                                               # torchao: Float8Linear casts on the fly, saves BF16 inputs
    fp8_params: bool = False                   # FP8 weights only (TE fp8_model_init): no BF16 weight copy
    optimizer_dtype: str = "fp32"              # Adam master weights + moments: fp32, or bf16 (NeMo optim.dtype)
    dropout: bool = True                       # dropout > 0 (masks saved); Llama / Nemotron / MLPerf GPT-3 use 0
    fsdp: bool = False                         # PyTorch FSDP-style sharding (per-module gathers) for zero >= 2
    # ZeRO-2 as PyTorch FSDP's SHARD_GRAD_OP (FSDP2: reshard_after_forward=False) issues it: each module's
    # weights all-gathered before its forward in every micro-batch, kept through its backward, its
    # gradients reduce-scattered right after (torch FullyShardedDataParallel ShardingStrategy docs).
    # False: ZeRO-1/2 in step-level buckets (Megatron distributed optimizer; Llama 3's FSDP keeps the
    # weights gathered across micro-batches).
    shard_grad_op: bool = False
    # How the per-layer ZeRO-3 gathers / reduce-scatters cross nodes: hierarchical (NCCL rings over all
    # NICs of a node, the default) or flat (one ring over the whole DP group at one NIC per GPU, as
    # DeepSpeed-2021 ZeRO-3; ../shared/docs/physics-notes.md "DeepSpeed ZeRO-3"; comet.hardware.network).
    dp_collective: str = "hierarchical"
    # ZeRO-3 gathered parameters resident at once: None = two layers (FSDP units are layers); DeepSpeed
    # frees gathers beyond a live-parameter budget (stage3_max_live_parameters + prefetch bucket).
    zero3_live_params: float | None = None
    # How the cross-entropy holds the logits (comet/workload/memory.py LOSS_LOGIT_BYTES): fused (Megatron's
    # vocab-parallel loss in place on an fp32 copy; a compiled PyTorch loss) or eager (PyTorch eager
    # F.cross_entropy on pred.float(): fp32 copy, saved fp32 log-softmax and two fp32 gradients) or
    # megatron (Megatron-Core's unfused default: the memory of fused, one kernel per step; the HBM
    # traffic of each is comet/workload/layers.py LOSS_HBM_BYTES).
    loss_impl: str = "fused"
    # Whose FSDP (zero >= 3 with fsdp): torch (PyTorch FSDP1/FSDP2, JAX: the fp32 shard is the parameter and
    # the optimizer's master; the root module stays gathered) or megatron (Megatron-FSDP: a bf16 parameter
    # shard beside the fp32 main-weight shard, like the distributed optimizer). comet/workload/memory.py
    fsdp_impl: str = "torch"
    # Uneven pipelines (comet.config.stages): transformer layers on the first / last stage, or the
    # embedding / loss counted as one layer each (Megatron-Core account_for_*_in_pipeline_split).
    pp_first_stage_layers: int | None = None
    pp_last_stage_layers: int | None = None
    pp_embedding_as_layer: bool = False
    pp_loss_as_layer: bool = False

    # ------------------------------------------------------------------ hash
    # perf (i16g-glue): a configuration keys ~5 cache look-ups per candidate; the dataclass's hash walks
    # its ~45 fields in Python (~1 us) on each. The same value (the hash of the fields' tuple, as the
    # generated __hash__ computes it) is kept in the instance once computed (as is label()); pickles and
    # copies carry the fields only (string hashes differ between processes).
    def __hash__(self) -> int:
        state = self.__dict__
        h = state.get("_hash")
        if h is None:
            h = state["_hash"] = hash(tuple([state[name] for name in _FIELD_NAMES]))
        return h

    def __getstate__(self) -> dict:
        state = self.__dict__
        return {name: state[name] for name in _FIELD_NAMES}

    # ------------------------------------------------------------------ derived values
    @property
    def sp(self) -> bool:
        return bool(self.sequence_parallel) and self.tp > 1

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step (gradient-accumulation steps)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Data-parallel degree of the expert weights: the stage's tp*cp*dp ranks over etp*ep."""
        return max(1, self.tp * self.cp * self.dp // (self.expert_tp * self.ep))

    @property
    def grad_reduce_bytes(self) -> int:
        """Bytes per gradient element on the wire of the data-parallel reduction."""
        return REDUCE_BYTES[self.reduce_dtype or self.grad_dtype]

    @property
    def per_module_dp_collectives(self) -> bool:
        """The layer blocks carry the data-parallel weight gathers / gradient reduce-scatters (ZeRO-3,
        FSDP SHARD_GRAD_OP) rather than the stage's step-level buckets."""
        return self.zero >= 3 or self.shard_grad_op

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def uneven(self) -> bool:
        return (self.pp_first_stage_layers is not None or self.pp_last_stage_layers is not None
                or self.pp_embedding_as_layer or self.pp_loss_as_layer)

    def chunk_layers(self, model: ModelSpec) -> tuple[int, ...]:
        """Transformer layers per model chunk (chunk index = vchunk * pp + stage)."""
        return chunk_layer_counts(model.layers, self.pp, self.vpp, self.pp_first_stage_layers,
                                  self.pp_last_stage_layers, self.pp_embedding_as_layer, self.pp_loss_as_layer)

    def stage_layers(self, model: ModelSpec, stage: int) -> int:
        chunks = self.chunk_layers(model)
        return sum(chunks[v * self.pp + stage] for v in range(self.vpp))

    def resolve(self, model: ModelSpec) -> "ParallelConfig":
        """Derive dp / sequence parallelism and check every rule. Raises ConfigError naming the rule."""
        cfg = self
        derived = {}    # perf: both derived fields set at once, without re-running __init__ (config/frozen.py)
        if cfg.sequence_parallel is None:
            derived["sequence_parallel"] = cfg.tp > 1
        if cfg.dp is None:
            if cfg.gpus is None:
                raise ConfigError("give either dp or gpus", field="dp")
            denom = cfg.tp * cfg.pp * cfg.cp
            if cfg.gpus % denom:
                raise ConfigError(f"gpus ({cfg.gpus}) must be divisible by tp*pp*cp = {cfg.tp}*{cfg.pp}*{cfg.cp} = {denom}",
                                  field="gpus")
            derived["dp"] = cfg.gpus // denom
        if derived:
            cfg = replace_fields(cfg, **derived)
        if cfg.dp < 1:
            raise ConfigError(f"must be >= 1, got {cfg.dp}", field="dp")
        if cfg.gpus is None:
            cfg = replace_fields(cfg, gpus=cfg.world)
        cfg.check(model)
        return cfg

    def check(self, model: ModelSpec) -> None:
        def rule(ok: bool, fld: str, msg) -> None:
            # perf: a message is formatted only when its rule fails (every estimate checks ~25 rules)
            if not ok:
                raise ConfigError(msg(), field=fld)

        rule(self.world == self.gpus, "gpus",
             lambda: f"tp*pp*dp*cp must equal gpus: {self.tp}*{self.pp}*{self.dp}*{self.cp} = {self.world} != {self.gpus}")
        rule(model.heads % self.tp == 0, "tp", lambda: f"heads ({model.heads}) must be divisible by tp ({self.tp})")
        rule(model.kv_heads % self.tp == 0, "tp", lambda: f"kv_heads ({model.kv_heads}) must be divisible by tp ({self.tp})")
        rule(model.ffn_hidden % self.tp == 0, "tp", lambda: f"ffn_hidden ({model.ffn_hidden}) must be divisible by tp ({self.tp})")
        chunks = self.chunk_layers(model)   # raises ConfigError naming the split rule
        rule(min(chunks) >= 1 or self.pp_embedding_as_layer or self.pp_loss_as_layer, "vpp",
             lambda: f"layers ({model.layers}) leave an empty model chunk on pp*vpp = {self.pp}*{self.vpp}")
        per = self.dp * self.micro_batch
        rule(self.global_batch % per == 0, "global_batch",
             lambda: f"global_batch ({self.global_batch}) must be divisible by dp*micro_batch = {self.dp}*{self.micro_batch} = {per}")
        rule(self.num_microbatches <= MAX_MICROBATCHES, "global_batch",
             lambda: f"{self.num_microbatches:,} micro-batches per step (global_batch / (dp*micro_batch)) is more than "
             f"{MAX_MICROBATCHES:,}: the replay holds every micro-batch in memory; raise micro_batch or dp")
        rule(model.seq_len % (2 * self.cp) == 0 or self.cp == 1, "cp",
             lambda: f"seq_len ({model.seq_len}) must be divisible by 2*cp = {2 * self.cp} (load-balanced causal context parallelism)")
        tokens_per_rank = model.seq_len // self.cp
        rule(not self.sp or tokens_per_rank % self.tp == 0, "sequence_parallel",
             lambda: f"sequence parallelism needs seq_len/cp ({tokens_per_rank}) divisible by tp ({self.tp})")
        rule(0 <= self.zero <= 3, "zero", lambda: f"must be 0, 1, 2 or 3, got {self.zero}")
        rule(self.grad_dtype in ("fp32", "bf16"), "grad_dtype", lambda: f"must be fp32 or bf16, got {self.grad_dtype!r}")
        rule(self.reduce_dtype in (None, *REDUCE_BYTES), "reduce_dtype",
             lambda: f"must be one of {', '.join(REDUCE_BYTES)} or unset, got {self.reduce_dtype!r}")
        rule(self.optimizer_dtype in ("fp32", "bf16"), "optimizer_dtype",
             lambda: f"must be fp32 or bf16, got {self.optimizer_dtype!r}")
        rule(self.fp8_impl in ("te", "torchao"), "fp8_impl", lambda: f"must be te or torchao, got {self.fp8_impl!r}")
        rule(self.attention_kernel in ("fused", "fa2"), "attention_kernel",
             lambda: f"must be fused or fa2, got {self.attention_kernel!r}")
        rule(self.loss_impl in ("fused", "eager", "megatron"), "loss_impl",
             lambda: f"must be fused, eager or megatron, got {self.loss_impl!r}")
        rule(self.fsdp_impl in ("torch", "megatron"), "fsdp_impl", lambda: f"must be torch or megatron, got {self.fsdp_impl!r}")
        rule(self.dp_collective in ("hierarchical", "flat"), "dp_collective",
             lambda: f"must be hierarchical or flat, got {self.dp_collective!r}")
        rule(not self.fp8_params or self.precision is Precision.FP8, "fp8_params",
             lambda: f"FP8 weights need precision fp8, got {self.precision.value}")
        # FSDP with pipeline parallelism does shard gradients (Llama 3 paper sec. 3.3.2: reduce-scatter per
        # micro-batch, weights kept gathered); Megatron's distributed optimizer cannot.
        rule(not self.shard_grad_op or (self.fsdp and self.zero == 2), "shard_grad_op",
             lambda: f"is FSDP's ZeRO-2: needs fsdp and zero 2, got fsdp={self.fsdp} zero={self.zero}")
        rule(not (self.zero >= 2 and self.pp > 1) or self.fsdp, "zero",
             lambda: f"ZeRO stage {self.zero} shards gradients, which pipeline parallelism (pp={self.pp}) cannot "
             "accumulate across micro-batches; use zero <= 1 with pp > 1")
        if self.vpp > 1:
            rule(self.schedule is Schedule.INTERLEAVED, "vpp",
                 lambda: f"vpp={self.vpp} needs schedule interleaved_1f1b, got {self.schedule.value}")
            rule(self.pp > 1, "vpp", lambda: f"vpp={self.vpp} needs pp > 1, got pp={self.pp}")
        if self.schedule is Schedule.INTERLEAVED:
            rule(self.num_microbatches % self.pp == 0, "global_batch",
                 lambda: f"interleaved 1F1B needs the micro-batch count ({self.num_microbatches}) divisible by pp ({self.pp})")
        rule(len(set(self.offload)) == len(self.offload), "offload", lambda: "lists a target twice")
        rule(not self.recompute_modules or (self.recompute is Recompute.SELECTIVE
                                            and self.selective_policy is SelectivePolicy.ATTENTION),
             "recompute_modules", lambda: "recompute_modules needs recompute: selective with selective_policy: "
             f"attention (Megatron-Core's selective recompute), got recompute {self.recompute.value}, "
             f"selective_policy {self.selective_policy.value}")
        check_expert_parallel(self, model)

    def label(self) -> str:
        """The design's short name, e.g. tp8-pp64-dp8-mb1-selective-z1-bf16 (kept once computed: every
        result of the configuration carries it)."""
        label = self.__dict__.get("_label")
        if label is None:
            label = self.__dict__["_label"] = self._label()
        return label

    def _label(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.vpp > 1:
            parts.append(f"vpp{self.vpp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"etp{self.etp}")
        if self.moe_dispatcher is not Dispatcher.ALLTOALL:
            parts.append(f"{self.moe_dispatcher.value}-dispatch")
        if self.moe_capacity_factor is not None:
            parts.append(f"cf{self.moe_capacity_factor:g}")
        if self.moe_imbalance != 1.0:
            parts.append(f"imb{self.moe_imbalance:g}")
        if self.moe_overlap_a2a:
            parts.append("a2a-overlap")
        if self.pp_first_stage_layers is not None or self.pp_last_stage_layers is not None:
            parts.append(f"ppf{self.pp_first_stage_layers or 'x'}l{self.pp_last_stage_layers or 'x'}")
        if self.pp_embedding_as_layer or self.pp_loss_as_layer:
            parts.append("pp" + ("e" if self.pp_embedding_as_layer else "") + ("l" if self.pp_loss_as_layer else ""))
        if self.dp_collective != "hierarchical":
            parts.append(f"{self.dp_collective}-dp")
        if self.optimizer_dtype != "fp32":
            parts.append(f"{self.optimizer_dtype}-optim")
        if self.shard_grad_op:
            parts.append("shard-grad-op")
        recompute = "+".join([self.recompute.value] + [m.value for m in self.recompute_modules])
        parts += [f"mb{self.micro_batch}", recompute, f"z{self.zero}", self.precision.value]
        return "-".join(parts)


_FIELD_NAMES = tuple(f.name for f in fields(ParallelConfig))   # what the dataclass's hash reads, in order
