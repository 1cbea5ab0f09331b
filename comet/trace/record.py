"""Record a real training step of a small Llama-style decoder: Kineto + PyTorch ET per rank, and the
measured step time (optional extra `record`: needs torch; the tests never import this module).

    python -m comet.trace.record --out data/traces/cpu/L2_h256 --layers 2 --hidden 256 --tp 2 --dp 1

One process per rank (torch.multiprocessing, torch.distributed: gloo on CPU, nccl on GPU), rank order
tp innermost then dp (Megatron). The model is Megatron-shaped so that its record_function scopes carry
comet's op roles (comet/workload/layers.py): `layers.<i>` around each layer, and inside it
`input_norm`, `qkv`, `attention`, `proj`, `proj.all_reduce`, `attention.dropout_add`, `mlp_norm`,
`fc1`, `swiglu`, `fc2`, `fc2.all_reduce`, `mlp.dropout_add`; the backward of a tensor-parallel linear
is an autograd Function with `<role>.dgrad`, `<role>.wgrad` and, column-parallel, the input-gradient
all-reduce `<role>.dgrad.all_reduce` (Megatron without async overlap: it runs after the wgrad).
Llama-style: RMSNorm, SwiGLU, no biases, untied output layer; no RoPE (comet's blocks have no RoPE op).
Outside the layers: `embedding` (vocab-parallel lookup + `embedding.all_reduce`), `head` (final_norm,
logits, vocab-parallel cross-entropy with three all-reduces), `dp.grad_all_reduce` (one fp32 bucket,
after the backward), `optimizer` (Adam step + zero_grad).

Timing: every rank runs `--warmup` steps, then `--steps` timed steps (barrier, step, barrier; wall
clock on rank 0), then one step under the profiler (Kineto) and one under the ET observer. `measured.yaml` (JSON text; not read as a trace) holds the median and every sample. Threads are
pinned (`torch.set_num_threads(--threads)`) so that ranks do not fight over cores.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path


def _build(args, rank: int):
    import torch
    import torch.distributed as dist
    from torch.profiler import record_function as scope

    tp, dp = args.tp, args.dp
    tp_rank, dp_rank = rank % tp, rank // tp
    # every rank creates every group (torch.distributed rule); the descriptions name them in the trace
    tp_groups = [dist.new_group(list(range(r * tp, r * tp + tp)), group_desc="tp") for r in range(dp)] if tp > 1 else None
    tp_group = tp_groups[dp_rank] if tp_groups else None
    dp_groups = [dist.new_group(list(range(t, tp * dp, tp)), group_desc="dp") for t in range(tp)] if dp > 1 else None
    dp_group = dp_groups[tp_rank] if dp_groups else None
    h, heads, f, V = args.hidden, args.heads, args.ffn, args.vocab
    hp, fp, Vp = heads // tp, f // tp, V // tp
    d = h // heads
    dtype = torch.float32

    def all_reduce(x, name):
        if tp > 1:
            with scope(name):
                dist.all_reduce(x, group=tp_group)
        return x

    class ColumnLinear(torch.autograd.Function):
        """y = x W^T with W split by output columns; backward: dgrad, wgrad, then the dgrad all-reduce."""
        @staticmethod
        def forward(ctx, x, w, role):
            ctx.save_for_backward(x, w)
            ctx.role = role
            return x @ w.t()

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            with scope(f"{ctx.role}.dgrad"):
                dx = g @ w
            with scope(f"{ctx.role}.wgrad"):
                dw = g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
            all_reduce(dx, f"{ctx.role}.dgrad.all_reduce")
            return dx, dw, None

    class RowLinear(torch.autograd.Function):
        """y = all_reduce(x W^T) with W split by input rows; backward: dgrad, wgrad (no collective)."""
        @staticmethod
        def forward(ctx, x, w, role):
            ctx.save_for_backward(x, w)
            ctx.role = role
            return x @ w.t()

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            with scope(f"{ctx.role}.dgrad"):
                dx = g @ w
            with scope(f"{ctx.role}.wgrad"):
                dw = g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
            return dx, dw, None

    class ReduceFromTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, name):
            return all_reduce(x, name)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def rmsnorm(x, w, role):
        with scope(role):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    gen = torch.Generator().manual_seed(1234 + tp_rank)

    def param(*shape, scale=0.02):
        return torch.nn.Parameter(torch.randn(*shape, generator=gen, dtype=dtype) * scale)

    layers = [dict(n1=torch.nn.Parameter(torch.ones(h)), qkv=param(3 * hp * d, h), proj=param(h, hp * d),
                   n2=torch.nn.Parameter(torch.ones(h)), fc1=param(2 * fp, h), fc2=param(h, fp))
              for _ in range(args.layers)]
    emb, head_w, nf = param(Vp, h), param(Vp, h), torch.nn.Parameter(torch.ones(h))
    params = [emb, head_w, nf] + [p for L in layers for p in L.values()]

    def layer(x, L, i):
        b, s, _ = x.shape
        with scope(f"layers.{i}"):
            y = rmsnorm(x, L["n1"], "input_norm")
            with scope("qkv"):
                qkv = ColumnLinear.apply(y, L["qkv"], "qkv")
            q, k, v = qkv.view(b, s, 3, hp, d).permute(2, 0, 3, 1, 4).unbind(0)
            with scope("attention"):
                a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                a = a.transpose(1, 2).reshape(b, s, hp * d)
            with scope("proj"):
                o = RowLinear.apply(a, L["proj"], "proj")
            o = ReduceFromTP.apply(o, "proj.all_reduce")
            with scope("attention.dropout_add"):
                x = x + o
            y = rmsnorm(x, L["n2"], "mlp_norm")
            with scope("fc1"):
                gu = ColumnLinear.apply(y, L["fc1"], "fc1")
            with scope("swiglu"):
                g_, u = gu.chunk(2, dim=-1)
                m = torch.nn.functional.silu(g_) * u
            with scope("fc2"):
                o = RowLinear.apply(m, L["fc2"], "fc2")
            o = ReduceFromTP.apply(o, "fc2.all_reduce")
            with scope("mlp.dropout_add"):
                return x + o

    class VocabCE(torch.autograd.Function):
        """Megatron's vocab-parallel cross-entropy: max, sum of exponentials and target logit all-reduced."""
        @staticmethod
        def forward(ctx, logits, target):
            lo = tp_rank * Vp
            m = logits.max(-1).values
            all_reduce(m, "cross_entropy.all_reduce_max")
            z = logits - m.unsqueeze(-1)
            e = z.exp()
            se = e.sum(-1)
            all_reduce(se, "cross_entropy.all_reduce_sum_exp")
            inside = (target >= lo) & (target < lo + Vp)
            idx = (target - lo).clamp(0, Vp - 1)
            t = torch.where(inside, z.gather(-1, idx.unsqueeze(-1)).squeeze(-1), torch.zeros_like(m))
            all_reduce(t, "cross_entropy.all_reduce_target")
            ctx.save_for_backward(e, se, idx, inside)
            return (se.log() - t).mean()

        @staticmethod
        def backward(ctx, g):
            e, se, idx, inside = ctx.saved_tensors
            with scope("cross_entropy.bwd"):
                p = e / se.unsqueeze(-1)
                p.scatter_add_(-1, idx.unsqueeze(-1), -inside.to(p.dtype).unsqueeze(-1))
                return p * (g / idx.numel()), None

    class VocabEmbedding(torch.autograd.Function):
        @staticmethod
        def forward(ctx, ids, w):
            lo = tp_rank * Vp
            inside = (ids >= lo) & (ids < lo + Vp)
            idx = (ids - lo).clamp(0, Vp - 1)
            out = w[idx] * inside.unsqueeze(-1)
            ctx.save_for_backward(idx, inside)
            ctx.rows = w.shape[0]
            return all_reduce(out, "embedding.all_reduce")

        @staticmethod
        def backward(ctx, g):
            idx, inside = ctx.saved_tensors
            with scope("embedding.grad_scatter_add"):
                dw = torch.zeros(ctx.rows, g.shape[-1], dtype=g.dtype)
                dw.index_add_(0, idx.reshape(-1), (g * inside.unsqueeze(-1)).reshape(-1, g.shape[-1]))
            return None, dw

    opt = torch.optim.Adam(params, lr=1e-4, foreach=True)   # multi-tensor Adam: one pass
    data = torch.Generator().manual_seed(99 + dp_rank)
    ids = torch.randint(0, V, (args.micro_batch, args.seq), generator=data)
    target = torch.randint(0, V, (args.micro_batch, args.seq), generator=data)

    def step():
        with scope("embedding"):
            x = VocabEmbedding.apply(ids, emb)
        for i, L in enumerate(layers):
            x = layer(x, L, i)
        with scope("head"):
            y = rmsnorm(x, nf, "final_norm")
            with scope("logits"):
                logits = ColumnLinear.apply(y, head_w, "logits")
            with scope("cross_entropy"):
                loss = VocabCE.apply(logits, target)
        loss.backward()
        if dp > 1:
            with scope("dp.grad_all_reduce"):
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                dist.all_reduce(flat, group=dp_group)
                flat /= dp
                off = 0
                for p in params:
                    n = p.numel()
                    p.grad.copy_(flat[off:off + n].view_as(p))
                    off += n
        with scope("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=False)
        return loss

    return step


def _worker(rank: int, args) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function

    torch.set_num_threads(args.threads)
    world = args.tp * args.dp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    step = _build(args, rank)
    for _ in range(args.warmup):
        step()
    samples = []
    for _ in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        dist.barrier()
        samples.append(time.perf_counter() - t0)
    out = Path(args.out)
    et_path = out / f"rank{rank}_et.json"
    # Kineto and ET come from two consecutive steps: the ET observer records every op's tensors, which
    # would inflate the Kineto op times it runs beside; the ops are the same in every step.
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("ProfilerStep#1"):      # the step annotation the importer looks for
            step()
    et = ExecutionTraceObserver().register_callback(str(et_path))
    et.start()
    step()
    et.stop()
    et.unregister_callback()
    prof.export_chrome_trace(str(out / f"rank{rank}_kineto.json"))
    for name in (f"rank{rank}_kineto.json", f"rank{rank}_et.json"):
        with open(out / name, "rb") as src, gzip.open(out / (name + ".gz"), "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        (out / name).unlink()
    if rank == 0:
        meta = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "ffn", "vocab", "seq", "micro_batch",
                                              "tp", "dp", "threads")}
        meta.update(step_s_median=statistics.median(samples), step_s_samples=samples,
                    torch=torch.__version__, dtype="fp32", backend="gloo")
        (out / "measured.yaml").write_text(json.dumps(meta, indent=1) + "\n")   # JSON is YAML; not a .json trace file
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m comet.trace.record", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    for name, default in (("layers", 2), ("hidden", 512), ("heads", 8), ("ffn", 1408), ("vocab", 1024),
                          ("seq", 128), ("micro-batch", 2), ("tp", 1), ("dp", 1), ("threads", 1),
                          ("warmup", 2), ("steps", 7), ("port", 29511)):
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args(argv)
    try:
        import torch.multiprocessing as mp
    except ImportError:
        print("comet trace record: needs torch (pip install -e '.[record]')", file=sys.stderr)
        return 2
    for flag, v, div in (("--heads", args.heads, args.tp), ("--ffn", args.ffn, args.tp), ("--vocab", args.vocab, args.tp),
                         ("--hidden", args.hidden, args.heads)):
        if v % div:
            print(f"comet trace record: {flag} {v} must be divisible by {div}", file=sys.stderr)
            return 2
    Path(args.out).mkdir(parents=True, exist_ok=True)
    os.environ["MASTER_PORT"] = str(args.port)
    mp.spawn(_worker, args=(args,), nprocs=args.tp * args.dp, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
