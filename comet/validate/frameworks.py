"""What a measurement row means where its cells are empty: each training framework's documented defaults.

An empty cell in a measurement CSV (schema: ../shared/calibration/SCHEMA.md) means "the source does not
say". comet fills it with the default of the row's `framework` (and, for Megatron-LM, the generation its
`framework_version` names), else with a generic default, and reports every filled cell as an assumption.
Explicit cells always win. No default is chosen by looking at the `source` text.

Sources of the defaults:
- Megatron-LM / Megatron-Core `megatron/training/arguments.py`: micro-batch 1, no distributed optimizer
  (ZeRO 0), no sequence parallelism, no --overlap-grad-reduce / --overlap-param-gather /
  --tp-comm-overlap, no recompute, TE fused attention, gradients accumulated and reduced in FP32
  (`accumulate_allreduce_grads_in_fp32` with bf16), vocab padded to 128 * tp, the unfused fp32
  cross-entropy (megatron-core 0.8.0 model_parallel_config.py `cross_entropy_loss_fusion = False`;
  `loss_impl` megatron; the 2021-22 code, mpu/cross_entropy.py on `output.float()`, has the same steps).
- Megatron-LM of the 2021-2022 papers (Narayanan SC21, Korthikanti MLSys23, both on A100): fp16 mixed
  precision, unfused softmax attention, no distributed optimizer, grad all-reduce after the backward
  ("No overlap of grad all-reduce with backprop in these runs", Korthikanti sec. 6.3). Versions up to
  2021 have no selective recompute (it came with Korthikanti et al., May 2022) nor uneven stages.
- NeMo (Framework Launcher configs, NeMo 2 performance recipes) and Megatron-Bridge perf recipes on
  Megatron-Core: distributed optimizer (ZeRO 1), sequence parallelism with TP, overlapped grad reduce
  and param gather, TP communication overlap (userbuffers; every H100 recipe sets tp_comm_overlap),
  gradients reduced in BF16 (`grad_reduce_in_fp32: false` / `grad_sync_dtype: bf16`), micro-batch 1.
  A row that states fsdp runs Megatron-FSDP (bf16 parameter shard + fp32 main-weight shard: `fsdp_impl`).
- torchtitan (`torchtitan/config/job_config.py`): FSDP2 (ZeRO 3), selective activation checkpointing,
  `mixed_precision_reduce = float32`, FSDP2 prefetches the next module's all-gather, no vocab padding,
  SDPA flash attention (FlashAttention-2 kernels: `attention_kernel` fa2), sequence parallel with TP.
  Its loss is compiled with the model (--training.compile) since 0.1.0 and ran eagerly before (`loss_impl`).
- llm-foundry (scripts/train/benchmarking yamls): PyTorch FSDP FULL_SHARD, `forward_prefetch` off (the
  FSDP default), bf16, flash attention (`attn_impl: flash`, the flash-attn 2 package: fa2), no vocab padding
  (MPT configs already pad to 50368). Composer (mosaicml 0.17.0 composer/trainer/dist_strategy.py) sets
  forward_prefetch False, backward_prefetch BACKWARD_POST, limit_all_gathers True; its `mixed_precision`
  modes (composer/trainer/mosaic_fsdp_utils.py get_mixed_precision) gather the weights in the autocast
  dtype (bf16) in DEFAULT and PURE alike (no fp32 all-gathers) and reduce in fp32 (DEFAULT) or bf16 (PURE,
  the llm-foundry yamls' fsdp_config). ZeRO 2 there is FSDP SHARD_GRAD_OP (`shard_grad_op`; docs/fsdp.md).
  Its flash_attn_fn gathers Q, K and V into flash-attn's packed varlen layout and scatters the output back
  in every layer (`bert_padding.unpad_input` / `index_first_axis` and `pad_input`, llm-foundry 0.3.0 to
  0.8.0 llmfoundry/models/layers/attention.py: `attention_unpad`).
- MaxText (JAX): FSDP over the data axis with XLA-scheduled gathers (overlapped), bf16, cuDNN flash;
  `selective` read as remat_policy save_qkv_proj (layer input and Q/K/V kept, the rest re-run).
- torchtitan `selective` is per-op SAC: SDPA outputs and every second matmul output kept.
- DeepSpeed ZeRO-3 as used in SC21 Table 2 (Megatron-DeepSpeed): fp16, unfused attention, activation
  checkpointing of every layer (`--checkpoint-activations`, as in Megatron-DeepSpeed's GPT scripts);
  ZeRO-3 gathers / reduce-scatters as one flat ring over the DP group at about one NIC per GPU
  (../shared/docs/physics-notes.md "DeepSpeed ZeRO-3 (2021)"; ParallelConfig.dp_collective); gathered
  parameters freed beyond stage3_max_live_parameters (1e9) + stage3_prefetch_bucket_size (5e8), the
  DeepSpeed config defaults (ParallelConfig.zero3_live_params).
- Meta's Llama 3 stack (Llama 3 paper sec. 3.3): FSDP (ZeRO 2 style), bf16, flash attention, TP with SP,
  uneven pipeline stages (one layer fewer on the first and the last, sec. 3.3.2).
- Interleaved pipeline schedule (`interleave`, used where a row leaves `vpp` empty; comet/validate/layout.py):
  Megatron-LM since the SC21 paper (Narayanan et al. sec. 2.2.2, `--num-layers-per-virtual-pipeline-stage`),
  Megatron-Core / NeMo / Megatron-Bridge (`virtual_pipeline_model_parallel_size`); each stage's layers
  split evenly over its vpp chunks (arguments.py: "number of layers per pipeline stage must be divisible by
  number of layers per virtual pipeline stage"). The Llama 3 stack interleaves with chunks of unequal size
  (Llama 3 paper sec. 3.3.2, Fig. 6). torchtitan: `pipeline_parallel_schedule = Interleaved1F1B`
  (torch.distributed.pipelining). Cannot: DeepSpeed (its PipelineEngine runs one stage per rank,
  deepspeed/runtime/pipe/schedule.py TrainSchedule), llm-foundry and automodel as used here (FSDP, no
  pipeline), MaxText (its circular pipeline, `num_pipeline_repeats`, is an XLA schedule comet does not model),
  generic rows (no framework: comet's default 1F1B).
- Attention kernel generation (`attention_kernel`): a flash-attention stack whose framework_version dates it
  before 2024-07 (an NGC `YY.MM` tag, a `YYYY-MM` date or an earlier year) runs FlashAttention-2-class
  kernels (fa2): Hopper-native attention was first published with FlashAttention-3 (arXiv:2407.08608,
  2024-07); later stacks get the fused class (TE 1.9.0 picks cuDNN fused attention on sm90, with context
  parallelism too). The Llama 3 stack (trained before 2024-07) likewise. See docs/attention.md.
- Generic (framework empty or unknown): comet's ParallelConfig defaults.
FP8 recipe default: Transformer Engine `DelayedScaling` (TE's default recipe); fp8_params default false.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class FrameworkDefaults:
    key: str
    micro_batch: int = 1
    precision: str = "bf16"
    flash_attention: bool = True
    zero: int = 1
    fsdp: bool = False
    sequence_parallel: bool | None = None    # None: on whenever tp > 1
    recompute: str = "none"
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    overlap_tp_comm: bool = False
    overlap_p2p_comm: bool = True            # Megatron-LM arguments.py: on unless --no-overlap-p2p-communication
    grad_dtype: str = "fp32"                 # dtype gradients are accumulated and reduced in
    reduce_dtype: str | None = None          # the DP reduction's dtype where it differs (ParallelConfig)
    vocab_pad_to: int = 128                  # Megatron make_vocab_size_divisible_by; 1 = none
    flops_formula: str = "megatron_model"    # how its TFLOP/s / MFU figures count FLOPs
    fp8_recipe: str = "delayed"
    fp8_impl: str = "te"                     # Transformer Engine; torchtitan uses torchao Float8Linear
    selective_policy: str = "attention"     # what `recompute: selective` keeps (ParallelConfig.SelectivePolicy)
    attention_kernel: str = "fused"          # TE / cuDNN fused attention; fa2: PyTorch SDPA / flash-attn 2
    dp_collective: str = "hierarchical"      # ZeRO-3 DP collectives: hierarchical or flat (ParallelConfig)
    shard_grad_op: bool = False              # ZeRO 2 under FSDP is PyTorch's SHARD_GRAD_OP (per-module gathers)
    zero3_live_params: float | None = None   # ZeRO-3 gathered parameters kept at once (None: two layers)
    loss_impl: str = "fused"                 # cross-entropy memory: fused (in place / compiled) or eager
    fsdp_impl: str = "torch"                 # a stated fsdp: PyTorch FSDP (torch) or Megatron-FSDP (megatron)
    attention_unpad: bool = False            # flash-attn varlen layout: Q/K/V gathered, output scattered per layer
    dropout: bool = False                    # Megatron-LM's arguments default 0.1; NeMo perf recipes, MLPerf,
                                             # torchtitan, MaxText and MPT configs train with dropout 0
    # What the framework can express, for the knobs a row leaves empty (comet/validate/memory_knobs.py,
    # comet/validate/layout.py):
    bf16_optimizer_state: bool = False       # Adam state in BF16 (NeMo `optim.dtype: bf16`)
    bf16_grad_reduce: bool = False           # gradients kept and reduced in BF16 (Megatron-Core --grad-reduce-in-bf16)
    selective_recompute: bool = True         # has selective recompute (Megatron-LM since Korthikanti et al. 2022)
    uneven_pipeline: bool = False            # stages of unequal layer counts (Megatron-Core first/last-stage
                                             # layers; earlier stacks need pp to divide the layers)
    interleave: bool = False                 # runs the interleaved 1F1B schedule (vpp > 1)
    uneven_chunks: bool = False              # a stage's vpp chunks may differ in layer count
    notes: dict = field(default_factory=dict)   # column -> why this default (shown with the assumption)


_MEGATRON_CORE = FrameworkDefaults(
    "megatron-lm", zero=0, fsdp_impl="megatron", uneven_pipeline=True, interleave=True, bf16_grad_reduce=True, sequence_parallel=False, dropout=True, overlap_grad_reduce=False,
    overlap_param_gather=False, loss_impl="megatron",
    notes={"zero": "Megatron-LM arguments.py: no --use-distributed-optimizer",
           "loss_impl": "Megatron-Core cross_entropy_loss_fusion defaults to False (model_parallel_config.py): "
                        "the unfused fp32 vocab_parallel_cross_entropy",
           "sequence_parallel": "Megatron-LM arguments.py: --sequence-parallel off"})
_MEGATRON_2021 = replace(_MEGATRON_CORE, key="megatron-lm (2021-22)", precision="fp16", flash_attention=False,
                         overlap_p2p_comm=False, uneven_pipeline=False, bf16_grad_reduce=False,
                         notes={"loss_impl": _MEGATRON_CORE.notes["loss_impl"],
                                "precision": "2021-22 Megatron-LM papers train in fp16 mixed precision",
                                "flash_attention": "before flash attention: unfused softmax kernels"})
_NEMO = FrameworkDefaults("nemo", zero=1, fsdp_impl="megatron", overlap_tp_comm=True, grad_dtype="bf16", bf16_optimizer_state=True,
                          uneven_pipeline=True, interleave=True,
                          notes={"grad_dtype": "NeMo perf recipes: grad_reduce_in_fp32 false / grad_sync_dtype bf16",
                                 "tp_comm_overlap": "NeMo H100 recipes set tp_comm_overlap"})

_MEGATRON_2021_NO_SELECTIVE = replace(_MEGATRON_2021, key="megatron-lm (2021)", selective_recompute=False)

FRAMEWORKS: dict[str, FrameworkDefaults] = {
    "megatron-lm": _MEGATRON_CORE,
    "nemo": _NEMO,
    # Megatron-Bridge runs Megatron-Core's optimizer, whose precision-aware variant keeps FP32 master
    # weights (a different byte count): no BF16-state step for it
    "megatron-bridge": replace(_NEMO, key="megatron-bridge", bf16_optimizer_state=False),
    "torchtitan": FrameworkDefaults("torchtitan", zero=3, fsdp=True, shard_grad_op=True, recompute="selective",
                                    vocab_pad_to=1,
                                    selective_policy="op_sac", fp8_impl="torchao", attention_kernel="fa2",
                                    interleave=True,
                                    flops_formula="palm_6n"),
    "automodel": FrameworkDefaults("automodel", zero=3, fsdp=True, shard_grad_op=True, vocab_pad_to=1,
                                   flops_formula="palm_6n"),
    "llm-foundry": FrameworkDefaults("llm-foundry", zero=3, fsdp=True, shard_grad_op=True, overlap_param_gather=False,
                                     vocab_pad_to=1, attention_kernel="fa2", flops_formula="llm_foundry",
                                     reduce_dtype="bf16", attention_unpad=True,
                                     notes={"shard_grad_op": "llm-foundry fsdp_config sharding_strategy "
                                            "SHARD_GRAD_OP: per-module gathers before each forward, "
                                            "gradients reduce-scattered per module after its backward",
                                            "reduce_dtype": "fsdp_config mixed_precision PURE (Composer "
                                            "get_mixed_precision: reduce_dtype = the autocast dtype)"}),
    "maxtext": FrameworkDefaults("maxtext", zero=3, fsdp=True, vocab_pad_to=1, flops_formula="palm_6n",
                                 selective_policy="save_qkv", reduce_dtype="bf16",
                                 notes={"reduce_dtype": "comet's earlier FSDP assumption, not verified in "
                                        "MaxText's sources"}),
    "deepspeed": FrameworkDefaults("deepspeed", precision="fp16", dropout=True, recompute="full", flash_attention=False, zero=3,
                                   sequence_parallel=False, overlap_grad_reduce=False, vocab_pad_to=1,
                                   flops_formula="narayanan_eq3", dp_collective="flat",
                                   # DeepSpeed config defaults: stage3_max_live_parameters 1e9 +
                                   # stage3_prefetch_bucket_size 5e8 (deepspeed/runtime/zero/config.py)
                                   zero3_live_params=1.5e9, reduce_dtype="fp16",
                                   notes={"reduce_dtype": "DeepSpeed communication_data_type unset: "
                                          "gradients reduced in the model's fp16 (fp32 partitions kept)",
                                          "dp_collective": "DeepSpeed-2021 ZeRO-3 gathers over the whole DP "
                                          "group as one ring at ~1 NIC per GPU (physics-notes.md)",
                                          "zero3_live_params": "gathered parameters kept at once: "
                                          "stage3_max_live_parameters + stage3_prefetch_bucket_size"}),
    # Llama 3 paper sec. 3.3.2: pipeline stages balanced by one layer fewer on the first and last stage
    # and an interleaved schedule whose chunks need not be equal (sec. 3.3.2, Fig. 6)
    "meta-internal": FrameworkDefaults("meta-internal", zero=2, fsdp=True, vocab_pad_to=1, flops_formula="palm_6n",
                                       uneven_pipeline=True, interleave=True, uneven_chunks=True,
                                       # Llama 3 405B trained before FlashAttention-3 (2024-07) was
                                       # published; the paper names no attention kernel
                                       attention_kernel="fa2",
                                       notes={"attention_kernel": "Llama 3 trained before Hopper-native "
                                              "attention kernels (FlashAttention-3, 2024-07) existed"}),
}
GENERIC = FrameworkDefaults("generic")

# torchtitan's loss (memory: comet/workload/memory.py LOSS_LOGIT_BYTES). Since 0.1.0
# (torchtitan/components/loss.py `build_cross_entropy_loss`) --training.compile also compiles the loss, which
# its published benchmarks set; before it, train.py kept `# TODO: compiling loss function causes CUDA
# errors, turning off for now` over `loss_fn = torch.compile(loss_fn)`, so the loss ran in eager mode.
# Versions that state 0.0.x (the version.txt of every checkout before 0.1.0) or a year up to 2024 get the
# eager loss; others (0.1.0 on, or a bare commit) the compiled one.
FRAMEWORKS["torchtitan"] = replace(
    FRAMEWORKS["torchtitan"], loss_impl="fused",
    notes={"loss_impl": "torchtitan >= 0.1.0 compiles the loss with --training.compile (components/loss.py)"})
_TORCHTITAN_EAGER_LOSS = replace(
    FRAMEWORKS["torchtitan"], key="torchtitan (< 0.1.0)", loss_impl="eager",
    notes={"loss_impl": "torchtitan before 0.1.0 left the loss uncompiled (train.py: compiling it 'causes CUDA "
                        "errors, turning off for now')"})


def _torchtitan_before_0_1(version: str) -> bool:
    year = _year(version)
    return bool(re.search(r"\b0\.0\.\d+\b", version)) or (year is not None and year <= 2024)


def _year(version: str) -> int | None:
    m = re.search(r"\b(20\d\d)\b", version)
    return int(m.group(1)) if m else None


def _defaults_by_year(framework: str, version: str) -> FrameworkDefaults:
    if framework == "torchtitan" and _torchtitan_before_0_1(version):
        return _TORCHTITAN_EAGER_LOSS
    if framework == "megatron-lm":
        year = _year(version)
        if year is not None and year <= 2021:
            return _MEGATRON_2021_NO_SELECTIVE
        return _MEGATRON_2021 if year is not None and year <= 2022 else _MEGATRON_CORE
    return FRAMEWORKS.get(framework, GENERIC)


def defaults_for(framework: str, version: str = "") -> FrameworkDefaults:
    """The framework's defaults; Megatron-LM versions that state a year up to 2022 get the defaults of
    that generation (fp16, unfused attention), and up to 2021 without selective recompute, which came
    with Korthikanti et al. (arXiv:2205.05198, May 2022); torchtitan before 0.1.0 has an eager loss. Stacks
    released before Hopper-native attention kernels existed run FlashAttention-2-class attention
    (`attention_generation`)."""
    return attention_generation(_defaults_by_year(framework, version), version)


# --------------------------------------------------------------------------- attention kernel generation
# Hopper-native attention (warp-specialised wgmma + TMA pipelines) was first published with
# FlashAttention-3 (Shah et al., arXiv:2407.08608, 2024-07-11), whose abstract puts FlashAttention-2 at
# "only 35% utilization on H100"; Transformer Engine 1.9.0 (the earliest TE on PyPI, wheel built
# 2024-08-14) selects cuDNN fused attention on sm90 "for performance reasons"
# (transformer_engine/pytorch/attention.py get_attention_backend), for context parallelism too (sub-backend
# F16_arbitrary_seqlen). A stack released before 2024-07 (NeMo's release of early 2024, nemo-toolkit 1.23.0,
# wheel of 2024-02-28, pins megatron-core 0.5.0) ran attention kernels of the FlashAttention-2 generation:
# comet's `fa2` class (attention_fa2; ../shared/calibration/attention.csv), not the fitted fused class.
HOPPER_ATTENTION_SINCE = (2024, 7)


def release_month(version: str) -> tuple[int, int] | None:
    """(year, month) a framework_version cell dates its stack to: an NGC container tag `YY.MM`
    ("NeMo 24.03.01 container", "NGC 23.09", "jax:25.01-..."), a `YYYY-MM` date, or a bare year (month 0:
    only years before the cut-off decide)."""
    m = re.search(r"\b(20\d\d)-(0[1-9]|1[0-2])\b", version)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.search(r"(?<![\d.v])(2\d)\.(0[1-9]|1[0-2])(?!\d)", version)
    if m:
        return 2000 + int(m.group(1)), int(m.group(2))
    year = _year(version)
    return (year, 0) if year is not None else None


def attention_generation(d: FrameworkDefaults, version: str) -> FrameworkDefaults:
    """FlashAttention-2-class attention for a flash-attention stack dated before HOPPER_ATTENTION_SINCE."""
    when = release_month(version)
    if d.attention_kernel != "fused" or not d.flash_attention or when is None:
        return d
    if when[1] == 0 and when[0] >= HOPPER_ATTENTION_SINCE[0]:    # a bare year that does not decide
        return d
    if when >= HOPPER_ATTENTION_SINCE:
        return d
    return replace(d, attention_kernel="fa2", notes={
        **d.notes, "attention_kernel": f"stack dated {when[0]}-{when[1]:02d}, before Hopper-native attention "
        "kernels (FlashAttention-3, 2024-07): FlashAttention-2 class"})
