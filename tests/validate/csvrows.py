"""Helpers for the validation tests: rows with the published CSV columns, written to a temporary CSV."""

import csv
from pathlib import Path

COLUMNS = ("source,model,params_b,layers,hidden,heads,ffn_hidden,seq_len,vocab,gpu,num_gpus,tp,pp,dp,cp,ep,vpp,"
           "micro_batch,global_batch,recompute,precision,metric,value,unit,notes").split(",")

KORTHIKANTI = "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models' (MLSys 2023)"
NARAYANAN = "Narayanan et al., SC21 'Efficient Large-Scale LM Training on GPU Clusters Using Megatron-LM'"
MEGATRON = "NVIDIA/Megatron-LM README.md 'Performance Benchmarking'"
MOSAIC = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"

# A 22B-shaped model (Korthikanti Table 3) on one node, and variants of it per source.
BASE = dict(params_b="22", layers="48", hidden="6144", heads="64", ffn_hidden="24576", seq_len="2048", vocab="51200",
            gpu="A100-SXM4-80GB", num_gpus="8", tp="8", pp="1", dp="", cp="", ep="", vpp="", micro_batch="4",
            global_batch="4", recompute="selective + sequence parallelism", precision="mixed", unit="", notes="")


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
    """Five rows: three modelled (Korthikanti time and MFU, one layer), two skipped (no TP/PP; MoE)."""
    rows = [
        row(),
        row(metric="mfu", value="41.5", unit="%"),
        row(model="GPT 22B (single transformer layer)", recompute="none", metric="layer_fwd_bwd_time_ms", value="19.6"),
        row(source=MEGATRON, model="GPT-3 177B", gpu="H100", num_gpus="96", tp="", pp="", micro_batch="",
            global_batch="1152", recompute="", precision="", metric="mfu", value="47", unit="%", layers="96",
            hidden="12288", heads="96", ffn_hidden="", seq_len="4096", vocab="131072"),
        row(model="MoE", ep="8", num_gpus="64"),
    ]
    return write_csv(tmp_path / "small.csv", rows)
