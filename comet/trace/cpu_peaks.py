"""Microbenchmark the CPU the recorder runs on, for its cluster spec (cluster_specs/vm_cpu_gloo.yaml).

    python -m comet.trace.cpu_peaks [--threads 1]        # needs torch (optional extra `record`)

Each figure is the best of several repeats (the fastest run is the least disturbed by other processes
on a shared machine), fp32, `torch.set_num_threads(--threads)`:
* GEMM peak: torch.mm 1024 x 1024 x 1024 -> FLOP/s. gemm_k_half from the same GEMM at k = 64:
  rate(k) / rate(1024) = k / (k + k_half) (the compute model's short-k term, comet/hardware/compute.py).
* memory bandwidth: c = a + b over 16 Mi floats (three 64 MiB streams: 2 read, 1 write) -> bytes/s.
* attention: scaled_dot_product_attention causal, b 2, heads 4, s 256, d 64: forward and forward+backward
  FLOP/s against the GEMM peak (the compute model's attention_fwd / attention_bwd; causal FLOPs halved,
  backward 2.5x the forward).
* per-op overhead: torch.add of two 1-element tensors (dispatcher + Python), the kernel_overhead_us.
* gloo all-reduce between 2 processes on this host (loopback): time at 4 KiB and 16 MiB gives latency and
  bus bandwidth of the ring model (2 (n-1)/n bytes / bw + 2 (n-1) latency, n = 2); half_efficiency_bytes
  from 256 KiB: eff(m) = m / (m + half).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _best(fn, repeats=7, inner=3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t) / inner)
    return best


def compute_peaks(threads: int) -> dict:
    import torch
    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    t = _best(lambda: a @ b)
    peak = 2 * 1024 ** 3 / t
    a64, b64 = torch.randn(1024, 64), torch.randn(64, 1024)
    r64 = 2 * 1024 * 1024 * 64 / _best(lambda: a64 @ b64)
    k_half = 64 * (peak / r64 - 1.0)
    x, y, z = torch.randn(16 << 20), torch.randn(16 << 20), torch.empty(16 << 20)
    bw = 3 * 4 * (16 << 20) / _best(lambda: torch.add(x, y, out=z), repeats=5, inner=2)
    q, k, v = (torch.randn(2, 4, 256, 64, requires_grad=True) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    fwd_flops = 4 * 2 * 4 * 256 * 256 * 64 * 0.5
    t_f = _best(lambda: sdpa(q, k, v, is_causal=True))
    t_fb = _best(lambda: sdpa(q, k, v, is_causal=True).sum().backward())
    one = torch.ones(1)
    t_op = _best(lambda: torch.add(one, one), repeats=7, inner=1000)
    return {"gemm_peak_tflops": peak / 1e12, "gemm_k_half": k_half, "memory_GBps": bw / 1e9,
            "attention_fwd": fwd_flops / t_f / peak,
            "attention_bwd": 2.5 * fwd_flops / max(t_fb - t_f, 1e-9) / peak, "op_overhead_us": t_op * 1e6}


def _gloo_worker(rank: int, out):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    res = {}
    for nbytes in (4 << 10, 256 << 10, 16 << 20):
        x = torch.ones(nbytes // 4)
        def run():
            dist.all_reduce(x)
        res[nbytes] = _best(run, repeats=9, inner=5 if nbytes < (1 << 20) else 2)
    if rank == 0:
        out.update(res)
    dist.destroy_process_group()


def gloo_peaks() -> dict:
    import torch.multiprocessing as mp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    with mp.Manager() as m:
        out = m.dict()
        mp.spawn(_gloo_worker, args=(out,), nprocs=2, join=True)
        res = dict(out)
    small, mid, big = res[4 << 10], res[256 << 10], res[16 << 20]
    latency = small / 2                                   # 2 (n-1) steps, n = 2
    bw = (16 << 20) / (big - small)                       # 2 (n-1)/n = 1 byte moved per byte of message
    eff_mid = (256 << 10) / ((mid - small) * bw)          # achieved fraction of the plateau at 256 KiB
    half = (256 << 10) * (1 / eff_mid - 1) if eff_mid < 1 else 0.0
    return {"gloo_latency_us": latency * 1e6, "gloo_bus_GBps": bw / 1e9, "gloo_half_efficiency_bytes": half,
            "allreduce_s": {str(k): v for k, v in res.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m comet.trace.cpu_peaks")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    out = compute_peaks(args.threads)
    out.update(gloo_peaks())
    for k, v in out.items():
        print(f"{k}: {v if isinstance(v, dict) else round(v, 4)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
