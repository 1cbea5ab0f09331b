"""Tiny synthetic Kineto traces whose replay can be checked by hand."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def kineto_doc(rank: int, world: int, collectives=("allreduce",), offset_us: float = 0.0,
               kernel_us: float = 100.0, comm_us: float = 50.0) -> dict:
    """A minimal Kineto trace of one step: per collective, a GEMM launch then an NCCL launch; a final
    cudaDeviceSynchronize. pid 100+rank, main thread tid 100+rank, compute stream 7, NCCL stream 20."""
    pid = 100 + rank
    t = 1000.0 + offset_us
    ev = []
    corr = 1

    def x(cat, name, ts, dur, p=pid, tid=pid, **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": p, "tid": tid, "ts": ts, "dur": dur, "args": args})

    start = t
    gpu_t = t
    for i, coll in enumerate(collectives):
        x("cpu_op", "aten::mm", t, 10)
        x("cuda_runtime", "cudaLaunchKernel", t + 2, 5, correlation=corr)
        gpu_t = max(gpu_t, t + 7)
        x("kernel", "sm80_gemm", gpu_t, kernel_us, p=rank, tid=7, correlation=corr, stream=7, device=rank)
        gpu_t += kernel_us
        corr += 1
        t += 12
        x("cpu_op", f"c10d::{coll}_", t, 10)
        x("cuda_runtime", "cudaEventRecord", t + 0.2, 0.5, correlation=1000 + corr)
        x("cuda_runtime", "cudaStreamWaitEvent", t + 0.8, 0.5, correlation=2000 + corr)
        x("user_annotation", "nccl:" + {"allreduce": "all_reduce"}.get(coll, coll), t + 1.5, 8)
        x("cuda_runtime", "cudaLaunchKernel", t + 2, 5, correlation=corr)
        name = {"allreduce": "ncclKernel_AllReduce_RING_LL_Sum_float", "broadcast": "ncclKernel_Broadcast_RING_LL_Sum_int8_t"}
        comm_t = max(gpu_t, t + 7)
        x("kernel", name.get(coll, "ncclKernel_AllGather_RING_LL"), comm_t, comm_us, p=rank, tid=20, correlation=corr,
          stream=20, device=rank, **{"Collective name": coll, "In msg nelems": 1024, "Out msg nelems": 1024,
                                      "Group size": world, "dtype": "Float", "Process Group Name": "0",
                                      "Process Group Ranks": str(list(range(world)))})
        gpu_t = comm_t + comm_us
        corr += 1
        t += 12
    sync_end = max(t + 5, gpu_t + 3)
    x("cuda_runtime", "cudaDeviceSynchronize", t, sync_end - t, correlation=corr)
    x("user_annotation", "ProfilerStep#3", start, sync_end - start + 1)
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": ev}


def write_kineto(dirpath: Path, docs: list[dict], gz: bool = False) -> list[Path]:
    dirpath.mkdir(parents=True, exist_ok=True)
    paths = []
    for d in docs:
        r = d["distributedInfo"]["rank"]
        p = dirpath / f"rank-{r}.json{'.gz' if gz else ''}"
        data = json.dumps(d).encode()
        p.write_bytes(gzip.compress(data) if gz else data)
        paths.append(p)
    return paths
