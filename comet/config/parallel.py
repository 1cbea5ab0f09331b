"""Parallel configuration (how the model is run) and the rules that make one valid."""

from __future__ import annotations

import enum
import operator
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


def _as_members(state: dict) -> dict:
    """{field: member} for each enum-typed field given as its value (a str): the rules and models compare
    members by identity, while a value hashes and compares equal to its member, so a configuration built
    with strings (ParallelConfig(selective_policy="op_sac")) would otherwise be evaluated as another one,
    and which figures a search got would depend on what its caches had seen. An unknown value is a
    ConfigError naming the field."""
    out = {}
    for name, kind in _ENUM_FIELDS:
        value = state[name]
        if value.__class__ is not kind:
            out[name] = _member(kind, value, name)
    modules = state["recompute_modules"]
    if modules and any(m.__class__ is not RecomputeModule for m in modules):
        out["recompute_modules"] = tuple(_member(RecomputeModule, m, "recompute_modules") for m in modules)
    return out


def _value_of(value) -> str:
    """An enum-typed field's value: a member's, or the str itself where a configuration not yet resolved
    holds one (its label names it in the error that refuses it).
    perf (i22g-glue): a member's _value_ attribute, read in C (.value is a Python-level property of
    enum.Enum: ~0.3 us each)"""
    return getattr(value, "_value_", value)


def _member(kind: type[enum.Enum], value, name: str) -> enum.Enum:
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"must be one of {', '.join(m.value for m in kind)}, got {value!r}", field=name) from None


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
    # memory-bound copies around the attention kernel (comet/workload/layer_parts.py unpad_copies)
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
    # perf (i18g-glue): the fields' tuple read in one C call (operator.itemgetter, 0.3 us against 1.3 us
    # for a comprehension over the names): a new configuration's hash 2.7 -> 1.5 us, and equality (what
    # the generated __eq__ compares: the fields' tuples of two instances of the class) likewise.
    def __hash__(self) -> int:
        state = self.__dict__
        h = state.get("_hash")
        if h is None:
            h = state["_hash"] = hash(_field_values(state))
        return h

    def __eq__(self, other) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self is other or _field_values(self.__dict__) == _field_values(other.__dict__)

    def __getstate__(self) -> dict:
        state = self.__dict__
        return {name: state[name] for name in _FIELD_NAMES}

    # ------------------------------------------------------------------ the global batch apart
    # A search meets each configuration with several global batches; only the micro-batch count reads it
    # (three rules of check, the pipeline plan, in-flight activations, FLOPs per step). What does not is
    # keyed by the configuration with global_batch 1.
    def batch_free(self) -> "ParallelConfig":
        """This configuration with global_batch 1 (a key, kept once computed like the hash)."""
        if self.global_batch == 1:
            return self
        state = self.__dict__
        free = state.get("_batch_free")
        if free is None:
            free = state["_batch_free"] = replace_fields(self, global_batch=1)
        return free

    def batch_free_fields(self) -> tuple:
        """Every field but the global batch, as a tuple: a key equal where batch_free() is, without
        building the configuration (~0.6 against ~2 us for one not seen before)."""
        return _batch_free_values(self.__dict__)

    def with_global_batch(self, global_batch: int) -> "ParallelConfig":
        """replace_fields(self, global_batch=global_batch), knowing its label (which does not read the
        global batch) and its batch_free()."""
        new = replace_fields(self, global_batch=global_batch)
        state, extra = self.__dict__, new.__dict__
        if "_label" in state:
            extra["_label"] = state["_label"]
        free = self if self.global_batch == 1 else state.get("_batch_free")
        if free is not None and global_batch != 1:
            extra["_batch_free"] = free
        return new

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
        # perf (i18g-glue): kept for the last layer count asked (the memory estimate and the builder ask
        # ~10 times per configuration; the shared lru_cache look-up reads and hashes seven fields)
        state = self.__dict__
        kept = state.get("_chunk_layers")
        if kept is not None and kept[0] == model.layers:
            return kept[1]
        chunks = chunk_layer_counts(model.layers, self.pp, self.vpp, self.pp_first_stage_layers,
                                    self.pp_last_stage_layers, self.pp_embedding_as_layer, self.pp_loss_as_layer)
        state["_chunk_layers"] = (model.layers, chunks)
        return chunks

    def stage_layers(self, model: ModelSpec, stage: int) -> int:
        chunks = self.chunk_layers(model)
        if self.vpp == 1:
            return chunks[stage]
        return sum(chunks[v * self.pp + stage] for v in range(self.vpp))

    def resolve(self, model: ModelSpec, batch: bool = True) -> "ParallelConfig":
        """Derive dp / sequence parallelism and check every rule. Raises ConfigError naming the rule.
        batch=False leaves out the rules that read the global batch (check_batch): what a search
        resolves once per configuration shape (comet/evaluate.py)."""
        cfg = self
        derived = _as_members(self.__dict__)   # perf: derived fields set at once, without re-running __init__
                                               # (config/frozen.py)
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
        cfg.check(model, batch)
        return cfg

    def check(self, model: ModelSpec, batch: bool = True) -> None:
        """Every rule, in this order; batch=False skips the three of check_batch (the global batch's)."""
        # perf: plain tests, a message formatted only when its rule fails (a closure per rule cost ~3 us)
        if self.world != self.gpus:
            raise ConfigError(f"tp*pp*dp*cp must equal gpus: {self.tp}*{self.pp}*{self.dp}*{self.cp} = {self.world} "
                              f"!= {self.gpus}", field="gpus")
        if model.heads % self.tp:
            raise ConfigError(f"heads ({model.heads}) must be divisible by tp ({self.tp})", field="tp")
        if model.kv_heads % self.tp:
            raise ConfigError(f"kv_heads ({model.kv_heads}) must be divisible by tp ({self.tp})", field="tp")
        if model.ffn_hidden % self.tp:
            raise ConfigError(f"ffn_hidden ({model.ffn_hidden}) must be divisible by tp ({self.tp})", field="tp")
        chunks = self.chunk_layers(model)   # raises ConfigError naming the split rule
        if not (min(chunks) >= 1 or self.pp_embedding_as_layer or self.pp_loss_as_layer):
            raise ConfigError(f"layers ({model.layers}) leave an empty model chunk on pp*vpp = {self.pp}*{self.vpp}",
                              field="vpp")
        if batch:
            self._check_batch_size()
        if not (model.seq_len % (2 * self.cp) == 0 or self.cp == 1):
            raise ConfigError(f"seq_len ({model.seq_len}) must be divisible by 2*cp = {2 * self.cp} (load-balanced "
                              "causal context parallelism)", field="cp")
        tokens_per_rank = model.seq_len // self.cp
        if self.sp and tokens_per_rank % self.tp:
            raise ConfigError(f"sequence parallelism needs seq_len/cp ({tokens_per_rank}) divisible by tp ({self.tp})",
                              field="sequence_parallel")
        if not 0 <= self.zero <= 3:
            raise ConfigError(f"must be 0, 1, 2 or 3, got {self.zero}", field="zero")
        if self.grad_dtype not in ("fp32", "bf16"):
            raise ConfigError(f"must be fp32 or bf16, got {self.grad_dtype!r}", field="grad_dtype")
        if self.reduce_dtype not in (None, *REDUCE_BYTES):
            raise ConfigError(f"must be one of {', '.join(REDUCE_BYTES)} or unset, got {self.reduce_dtype!r}",
                              field="reduce_dtype")
        if self.optimizer_dtype not in ("fp32", "bf16"):
            raise ConfigError(f"must be fp32 or bf16, got {self.optimizer_dtype!r}", field="optimizer_dtype")
        if self.fp8_impl not in ("te", "torchao"):
            raise ConfigError(f"must be te or torchao, got {self.fp8_impl!r}", field="fp8_impl")
        if self.attention_kernel not in ("fused", "fa2"):
            raise ConfigError(f"must be fused or fa2, got {self.attention_kernel!r}", field="attention_kernel")
        if self.loss_impl not in ("fused", "eager", "megatron"):
            raise ConfigError(f"must be fused, eager or megatron, got {self.loss_impl!r}", field="loss_impl")
        if self.fsdp_impl not in ("torch", "megatron"):
            raise ConfigError(f"must be torch or megatron, got {self.fsdp_impl!r}", field="fsdp_impl")
        if self.dp_collective not in ("hierarchical", "flat"):
            raise ConfigError(f"must be hierarchical or flat, got {self.dp_collective!r}", field="dp_collective")
        if self.fp8_params and self.precision is not Precision.FP8:
            raise ConfigError(f"FP8 weights need precision fp8, got {self.precision.value}", field="fp8_params")
        # FSDP with pipeline parallelism does shard gradients (Llama 3 paper sec. 3.3.2: reduce-scatter per
        # micro-batch, weights kept gathered); Megatron's distributed optimizer cannot.
        if self.shard_grad_op and not (self.fsdp and self.zero == 2):
            raise ConfigError(f"is FSDP's ZeRO-2: needs fsdp and zero 2, got fsdp={self.fsdp} zero={self.zero}",
                              field="shard_grad_op")
        if self.zero >= 2 and self.pp > 1 and not self.fsdp:
            raise ConfigError(f"ZeRO stage {self.zero} shards gradients, which pipeline parallelism (pp={self.pp}) "
                              "cannot accumulate across micro-batches; use zero <= 1 with pp > 1", field="zero")
        if self.vpp > 1:
            if self.schedule is not Schedule.INTERLEAVED:
                raise ConfigError(f"vpp={self.vpp} needs schedule interleaved_1f1b, got {self.schedule.value}",
                                  field="vpp")
            if self.pp <= 1:
                raise ConfigError(f"vpp={self.vpp} needs pp > 1, got pp={self.pp}", field="vpp")
        if batch:
            self._check_interleaved_batch()
        if len(set(self.offload)) != len(self.offload):
            raise ConfigError("lists a target twice", field="offload")
        if self.recompute_modules and not (self.recompute is Recompute.SELECTIVE
                                           and self.selective_policy is SelectivePolicy.ATTENTION):
            raise ConfigError("recompute_modules needs recompute: selective with selective_policy: attention "
                              f"(Megatron-Core's selective recompute), got recompute {self.recompute.value}, "
                              f"selective_policy {self.selective_policy.value}", field="recompute_modules")
        check_expert_parallel(self, model)

    def check_batch(self) -> None:
        """The rules that read the global batch, in check's order: on a configuration whose other rules
        pass (check(model, batch=False)), the error check(model) raises first, if any."""
        self._check_batch_size()
        self._check_interleaved_batch()

    def _check_batch_size(self) -> None:
        per = self.dp * self.micro_batch
        if self.global_batch % per:
            raise ConfigError(f"global_batch ({self.global_batch}) must be divisible by dp*micro_batch = "
                              f"{self.dp}*{self.micro_batch} = {per}", field="global_batch")
        if self.num_microbatches > MAX_MICROBATCHES:
            raise ConfigError(f"{self.num_microbatches:,} micro-batches per step (global_batch / (dp*micro_batch)) is "
                              f"more than {MAX_MICROBATCHES:,}: the replay holds every micro-batch in memory; raise "
                              "micro_batch or dp", field="global_batch")

    def _check_interleaved_batch(self) -> None:
        if self.schedule is Schedule.INTERLEAVED and self.num_microbatches % self.pp:
            raise ConfigError(f"interleaved 1F1B needs the micro-batch count ({self.num_microbatches}) divisible by "
                              f"pp ({self.pp})", field="global_batch")

    def label(self) -> str:
        """The design's short name, e.g. tp8-pp64-dp8-mb1-selective-z1-bf16 (kept once computed: every
        result of the configuration carries it)."""
        label = self.__dict__.get("_label")
        if label is None:
            label = self.__dict__["_label"] = self._make_label()
        return label

    def _make_label(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.vpp > 1:
            parts.append(f"vpp{self.vpp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"etp{self.etp}")
        if self.moe_dispatcher != Dispatcher.ALLTOALL:     # != : a value given as its str compares equal
            parts.append(f"{_value_of(self.moe_dispatcher)}-dispatch")
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
        recompute = _value_of(self.recompute)
        if self.recompute_modules:
            recompute = "+".join([recompute] + [_value_of(m) for m in self.recompute_modules])
        parts += [f"mb{self.micro_batch}", recompute, f"z{self.zero}", _value_of(self.precision)]
        return "-".join(parts)


_FIELD_NAMES = tuple(f.name for f in fields(ParallelConfig))   # what the dataclass's hash reads, in order
_field_values = operator.itemgetter(*_FIELD_NAMES)               # a __dict__ -> the fields' tuple
_batch_free_values = operator.itemgetter(*(name for name in _FIELD_NAMES if name != "global_batch"))


# the enum-typed fields _as_members makes members (recompute_modules, a tuple of RecomputeModule, apart)
_ENUM_FIELDS = (("schedule", Schedule), ("recompute", Recompute), ("selective_policy", SelectivePolicy),
                ("precision", Precision), ("moe_dispatcher", Dispatcher))
