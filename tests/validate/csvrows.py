"""Helpers for the validation tests: rows in the measurement schema (../shared/calibration/SCHEMA.md, v2),
written to a temporary CSV."""

import csv
from pathlib import Path

COLUMNS = ("source,model,params_b,layers,hidden,heads,kv_heads,ffn_hidden,activation,attention,seq_len,vocab,"
           "tied_embeddings,moe_experts,moe_topk,moe_shared_experts,moe_dense_layers,gpu,gpu_model,num_gpus,tp,pp,"
           "dp,cp,ep,etp,vpp,pp_first_stage_layers,pp_last_stage_layers,zero,fsdp,sequence_parallel,micro_batch,"
           "global_batch,recompute,recompute_layers,precision,fp8_recipe,fp8_params,tp_comm_overlap,"
           "overlap_grad_reduce,overlap_param_gather,framework,framework_version,metric,flops_formula,"
           "mfu_peak_tflops,total_tokens,memory_measure,value,unit,notes").split(",")

KORTHIKANTI = "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models' (MLSys 2023)"
NARAYANAN = "Narayanan et al., SC21 'Efficient Large-Scale LM Training on GPU Clusters Using Megatron-LM'"
MEGATRON = "NVIDIA/Megatron-LM README.md 'Performance Benchmarking'"
MOSAIC = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"

# A 22B-shaped model (Korthikanti Table 3) on one A100 node, as the 2022 Megatron-LM ran it.
BASE = dict(params_b="22", layers="48", hidden="6144", heads="64", ffn_hidden="24576", seq_len="2048", vocab="51200",
            gpu="A100-SXM4-80GB", gpu_model="a100-sxm-80gb", num_gpus="8", tp="8", pp="1", micro_batch="4",
            global_batch="4", recompute="selective", sequence_parallel="true", precision="fp16",
            framework="megatron-lm", framework_version="Megatron-LM (MLSys23 paper, 2022)")


def row(**kw) -> dict:
    r = dict(BASE, source=KORTHIKANTI, model="GPT 22B", metric="iteration_time_s", value="1.10")
    r.update(kw)
    return r


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})
    return path


def small_csv(tmp_path) -> Path:
    """Five rows: three modelled (Korthikanti time and MFU, one layer), one skipped (no TP/PP, no batch), one MoE
    (two layers of 8 experts, top-2, ep 8 x etp 1 over the 8 GPUs)."""
    rows = [
        row(),
        row(metric="mfu", value="41.5", unit="%", flops_formula="megatron_model", mfu_peak_tflops="312"),
        row(model="GPT 22B (single transformer layer)", recompute="none", metric="layer_fwd_bwd_time_ms", value="19.6"),
        row(source=MEGATRON, model="GPT-3 177B", gpu="H100", gpu_model="h100-sxm-80gb", num_gpus="96", tp="", pp="",
            micro_batch="", global_batch="", recompute="", precision="", metric="mfu", value="47", unit="%",
            layers="96", hidden="12288", heads="96", ffn_hidden="", seq_len="4096", vocab="131072",
            framework_version="Megatron-Core r0.8.0"),
        row(model="MoE", layers="2", moe_experts="8", moe_topk="2", ep="8", etp="1"),
    ]
    return write_csv(tmp_path / "small.csv", rows)
