"""Record a real training step of a small Llama-style decoder: Kineto + PyTorch ET per rank, and the
measured step time (optional extra `record`: needs torch; the tests never import this module).

    python -m comet.trace.record --out data/traces/cpu L2_h512_mb2_s128_tp1_dp1 L2_h512_mb2_s128_tp2_dp1 ...

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

Timing on a shared machine: all configurations run in one launch (as many processes as the largest
needs; a smaller one runs on the lowest ranks while the others wait in a barrier) and are timed
interleaved: `--rounds` rounds, each running `--steps` timed steps of every configuration in turn
(barrier, step, barrier; wall clock on rank 0). Other users' load then falls on every configuration
alike. `<name>/measured.yaml` (JSON text; not read as a trace) holds the configuration, every sample,
their median and their minimum: the step time with the least interference from other users (the
rationale of Python's timeit: higher values are other processes, not the code). At `--profiles`
rounds spread over the run each configuration also runs one step under the profiler (Kineto,
`record_shapes`); the fastest of them is kept, with one ET observer step right after it. Threads are pinned (`torch.set_num_threads(--threads)`). Each trace's
`distributedInfo` is rewritten to describe its configuration's own job (ranks, world size, groups).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
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
    dp_groups = [dist.new_group(list(range(t, tp * dp, tp)), group_desc="dp") for t in range(tp)] if dp > 1 else None
    if rank >= tp * dp:
        return None                  # not a process of this configuration
    tp_group = tp_groups[dp_rank] if tp_groups else None
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

    class ColumnLinear(RowLinear):
        """y = x W^T with W split by output columns; backward: dgrad, wgrad, then the dgrad all-reduce."""
        @staticmethod
        def backward(ctx, g):
            dx, dw, _ = RowLinear.backward(ctx, g)
            all_reduce(dx, f"{ctx.role}.dgrad.all_reduce")
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


_NAME = re.compile(r"^L(\d+)_h(\d+)_mb(\d+)_s(\d+)_tp(\d+)_dp(\d+)$")


def parse_config(name: str, vocab: int = 1024) -> argparse.Namespace:
    """`L2_h512_mb2_s128_tp1_dp1` -> the configuration: head dim 64, SwiGLU width 2.75 x hidden (Llama's
    8/3 x hidden rounded to a multiple of 64 x tp), untied vocabulary `vocab`."""
    m = _NAME.match(name)
    if not m:
        raise ValueError(f"configuration {name!r}: expected L<layers>_h<hidden>_mb<micro-batch>_s<seq>_tp<tp>_dp<dp>")
    layers, hidden, mb, seq, tp, dp = map(int, m.groups())
    return argparse.Namespace(name=name, layers=layers, hidden=hidden, heads=hidden // 64, ffn=hidden * 11 // 4,
                              vocab=vocab, seq=seq, micro_batch=mb, tp=tp, dp=dp)


def _rewrite_dist_info(path: Path, cfg, rank: int) -> None:
    """The trace's distributedInfo describes the launch (every configuration's processes); make it describe
    this configuration's job: its ranks and its own process groups."""
    doc = json.loads(path.read_text())
    info = doc.get("distributedInfo") or {}
    groups = []
    if cfg.tp > 1:
        r0 = rank // cfg.tp * cfg.tp
        groups.append({"pg_name": "tp", "pg_desc": "tp", "pg_size": cfg.tp, "ranks": list(range(r0, r0 + cfg.tp))})
    if cfg.dp > 1:
        groups.append({"pg_name": "dp", "pg_desc": "dp", "pg_size": cfg.dp,
                       "ranks": list(range(rank % cfg.tp, cfg.tp * cfg.dp, cfg.tp))})
    info.update(rank=rank, world_size=cfg.tp * cfg.dp, pg_count=len(groups), pg_config=groups)
    doc["distributedInfo"] = info
    path.write_text(json.dumps(doc))


def _gzip(path: Path) -> None:
    with open(path, "rb") as src, gzip.open(str(path) + ".gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()


def _worker(rank: int, args, configs) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function

    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    world = max(c.tp * c.dp for c in configs)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # Every rank builds the process groups of every configuration in the same order (torch.distributed
    # rule); a configuration of fewer processes than the launch runs on the lowest ranks.
    steps = [_build(c, rank) for c in configs]
    for c, step in zip(configs, steps):
        for _ in range(args.warmup):
            if step:
                step()
    samples = {c.name: [] for c in configs}
    profiled = {c.name: float("inf") for c in configs}   # wall time of the kept profiled step
    out = Path(args.out)
    profile_rounds = {args.rounds * (i + 1) // (args.profiles + 1) for i in range(args.profiles)}
    for rnd in range(args.rounds):
        for c, step in zip(configs, steps):
            for _ in range(args.steps):
                dist.barrier()
                t0 = time.perf_counter()
                if step:
                    step()
                dist.barrier()
                samples[c.name].append(time.perf_counter() - t0)
            if rnd not in profile_rounds:
                continue
            # --profiles steps under the profiler at rounds spread over the run; the fastest is kept (the
            # one other users' load disturbed least). Kineto and ET come from two consecutive steps: the ET
            # observer records every op's tensors, which would inflate the op times it ran beside.
            folder = out / c.name
            folder.mkdir(parents=True, exist_ok=True)
            dist.barrier()
            t0 = time.perf_counter()
            if step:
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    with record_function("ProfilerStep#1"):      # the step annotation the importer looks for
                        step()
            dist.barrier()
            took = torch.tensor([time.perf_counter() - t0])
            dist.broadcast(took, src=0)                          # every rank keeps the same step
            if took.item() >= profiled[c.name]:
                continue
            profiled[c.name] = took.item()
            if step:
                prof.export_chrome_trace(str(folder / f"rank{rank}_kineto.json"))
                _rewrite_dist_info(folder / f"rank{rank}_kineto.json", c, rank)
                _gzip(folder / f"rank{rank}_kineto.json")
                et = ExecutionTraceObserver().register_callback(str(folder / f"rank{rank}_et.json"))
                et.start()
                step()
                et.stop()
                et.unregister_callback()
                _gzip(folder / f"rank{rank}_et.json")
            dist.barrier()
    if rank == 0:
        for c in configs:
            meta = {k: getattr(c, k) for k in ("layers", "hidden", "heads", "ffn", "vocab", "seq", "micro_batch",
                                              "tp", "dp")}
            meta.update(threads=args.threads, step_s_median=statistics.median(samples[c.name]),
                        step_s_min=min(samples[c.name]), step_s_samples=samples[c.name],
                        profiled_step_s=profiled[c.name], rounds=args.rounds, steps_per_round=args.steps,
                        torch=torch.__version__, dtype="fp32", backend="gloo")
            # JSON text (valid YAML) under a name the trace loader does not read as a trace
            (out / c.name / "measured.yaml").write_text(json.dumps(meta, indent=1) + "\n")
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m comet.trace.record", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder; one sub-folder per configuration")
    p.add_argument("configs", nargs="+", help="configurations, L<layers>_h<hidden>_mb<mb>_s<seq>_tp<tp>_dp<dp>")
    for name, default in (("vocab", 1024), ("threads", 1), ("warmup", 2), ("rounds", 10), ("steps", 2),
                          ("profiles", 3),
                          ("port", 29511)):
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args(argv)
    try:
        import torch.multiprocessing as mp
    except ImportError:
        print("comet trace record: needs torch (pip install -e '.[record]')", file=sys.stderr)
        return 2
    try:
        configs = [parse_config(n, args.vocab) for n in args.configs]
    except ValueError as exc:
        print(f"comet trace record: {exc}", file=sys.stderr)
        return 2
    for c in configs:
        for what, v, div in (("heads", c.heads, c.tp), ("ffn", c.ffn, c.tp), ("vocab", c.vocab, c.tp)):
            if v % div:
                print(f"comet trace record: {c.name}: {what} {v} must be divisible by tp {div}", file=sys.stderr)
                return 2
    Path(args.out).mkdir(parents=True, exist_ok=True)
    os.environ["MASTER_PORT"] = str(args.port)
    mp.spawn(_worker, args=(args, configs), nprocs=max(c.tp * c.dp for c in configs), join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
