"""PyTorch profiler (Kineto) Chrome-trace JSON -> one `RankTrace` (see docs/trace-formats.md §1).

The graph recipe is HTA's critical-path one (hta/analyzers/critical_path_analysis.py):
1. CPU events of each thread nest by [ts, ts+dur]; a runtime call belongs to its innermost cpu_op.
   Nodes on a thread: every runtime call that launches GPU work or waits for it, plus every
   top-level cpu_op that does neither. The host time between consecutive nodes (python, ops that
   launch nothing, unmodelled runtime calls) is kept as `delay_s` on the STREAM edge.
2. Launch: kernel/memcpy/memset `args.correlation` == runtime call `args.correlation` (LAUNCH edge).
3. GPU ops of one (device, stream) run in ts order (STREAM edges).
4. cudaEventRecord -> cudaStreamWaitEvent: SYNC edge from the last op of the recording stream to the
   next op of the waiting stream (exact with `cuda_sync` "Stream Wait Event"; else inferred).
5. Synchronize calls wait for the GPU op that ended last inside the call (SYNC edge GPU -> CPU);
   the call keeps only the part after that op ended as its own duration.
"""

from __future__ import annotations

import bisect
import math
import re

from comet.errors import TraceError
from comet.graph.ir import Collective, DepKind, KernelClass, Op, OpKind
from comet.trace.common import (RankTrace, collective_from_kernel, collective_from_name, dtype_bytes,
                                msg_bytes_of, parse_rank_list, stride_of)

_US = 1e-6
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_NEST_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "Operator", "Runtime"}
_OP_CATS = {"cpu_op", "Operator"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
_GPU_CATS = {"kernel": OpKind.COMPUTE, "Kernel": OpKind.COMPUTE, "gpu_memcpy": OpKind.MEMCPY,
             "Memcpy": OpKind.MEMCPY, "gpu_memset": OpKind.MEMCPY, "Memset": OpKind.MEMCPY}
_SYNC_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
               "cuCtxSynchronize", "cuEventSynchronize", "hipStreamSynchronize", "hipDeviceSynchronize",
               "hipEventSynchronize"}
_RECORD_CALLS = {"cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord", "hipEventRecord"}
_WAIT_CALLS = {"cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent"}


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def parse_kineto(doc: dict, source: str, step=None, rank_hint: int | None = None) -> RankTrace:
    """Import one rank. `step`: None (last complete ProfilerStep), an int N, or "all" (every event)."""
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise TraceError("not a Kineto trace: no 'traceEvents' list", path=source)
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rt = RankTrace(rank=0, source=source, fmt="kineto")
    if isinstance(info.get("rank"), int):
        rt.rank, rt.rank_from = info["rank"], "distributedInfo"
    elif rank_hint is not None:
        rt.rank, rt.rank_from = rank_hint, "file name"
    rt.world_size = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    for pg in info.get("pg_config") or []:
        if isinstance(pg, dict) and "pg_name" in pg:
            rt.group_ranks[str(pg["pg_name"])] = parse_rank_list(pg.get("ranks"))

    cpu, gpu, cuda_sync = [], [], {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or not _num(e.get("ts")) or not _num(e.get("dur", 0)):
            continue
        cat = e.get("cat")
        if cat in _NEST_CATS and _num(e.get("pid")):
            cpu.append(e)
        elif cat in _GPU_CATS:
            gpu.append(e)
        elif cat == "cuda_sync":
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                cuda_sync[corr] = e
    if not cpu and not gpu:
        raise TraceError("Kineto trace has no CPU or GPU events (empty, or not a PyTorch profiler trace)",
                         path=source)
    t0, t1, main, label = _window(doc, cpu, gpu, step, source)
    rt.step = label
    rt.pid = main[0] if main else (cpu[0]["pid"] if cpu else None)
    if main:
        cpu = [e for e in cpu if e["pid"] == main[0] and t0 <= e["ts"] < t1]
    builder = _Builder(rt, cpu, gpu, cuda_sync, t0, main, all_events=(t1 == math.inf))
    builder.build()
    rt.comm_calls = builder.comm_calls()
    base_ns = doc.get("baseTimeNanoseconds")
    if _num(base_ns):                    # 2024+ traces: ts relative to baseTimeNanoseconds
        rt.step_start_us = t0 + base_ns / 1000.0
    return rt


def _window(doc, cpu, gpu, step, source):
    """(t0, t1, (pid, tid) of the step thread or None, label) of the iteration to import."""
    steps = {}
    for e in cpu:
        m = _STEP.match(str(e.get("name", "")))
        if m and e["cat"] in ("user_annotation", "cpu_op"):
            steps.setdefault(int(m.group(1)), e)
    if not cpu and not gpu:     # also reached from comet/trace/recognize.py (trace inspect)
        raise TraceError("Kineto trace has no CPU or GPU events (empty, or not a PyTorch profiler trace)",
                         path=source)
    if step == "all" or not steps:
        if step not in (None, "all"):
            raise TraceError(f"--step {step}: the trace has no ProfilerStep annotations", path=source)
        t0 = min(e["ts"] for e in (cpu or gpu))
        return t0, math.inf, None, "all events"
    if step is not None:
        try:
            chosen = steps[int(step)]
        except (KeyError, ValueError):
            raise TraceError(f"no ProfilerStep#{step} in the trace (steps: {sorted(steps)})", path=source) from None
    else:
        trace_end = max((e["ts"] + e.get("dur", 0) for e in doc["traceEvents"]
                         if isinstance(e, dict) and e.get("cat") == "Trace" and _num(e.get("ts"))), default=math.inf)
        complete = [n for n, e in steps.items() if e.get("dur", 0) > 0 and e["ts"] + e["dur"] <= trace_end + 1]
        chosen = steps[max(complete or steps)]
    return chosen["ts"], chosen["ts"] + chosen["dur"], (chosen["pid"], chosen["tid"]), chosen["name"]


class _Builder:
    """Turns the events of one window into nodes and edges of `rt`."""

    def __init__(self, rt: RankTrace, cpu, gpu, cuda_sync, t0, main, all_events):
        self.rt, self.t0, self.main, self.all_events = rt, t0, main, all_events
        self.cpu, self.gpu, self.cuda_sync = cpu, gpu, cuda_sync
        self.gpu_by_corr: dict = {}
        for e in gpu:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                self.gpu_by_corr.setdefault(corr, []).append(e)
        self.devices = sorted({e.get("pid") for e in gpu}, key=str)
        self.records: dict = {}         # thread -> sorted [(ts, correlation)] of cudaEventRecord
        self.waits: list = []           # (thread, ts, correlation) of cudaStreamWaitEvent
        self.record_by_corr: dict = {}
        self.launch_of: dict = {}       # id(gpu event) -> (cpu node id, launch ts, thread, names)
        self.chains: dict = {}          # thread -> [(ts, end, node id)]
        self.gpu_nodes: list = []       # (event, node id)

    # ------------------------------------------------------------------ CPU side
    def build(self) -> None:
        rt = self.rt
        threads: dict = {}
        for e in self.cpu:
            threads.setdefault((e["pid"], e["tid"]), []).append(e)
        main = self.main or (max(threads, key=lambda k: len(threads[k])) if threads else None)
        main_tid = main[1] if main else 0
        rt.root = rt.add(f"r{rt.rank}:root", Op(name=rt.step if rt.step != "all events" else "trace start",
                                                 kind=OpKind.CPU, rank=rt.rank, stream=f"cpu:{main_tid}",
                                                 duration_s=0.0, start_s=0.0))
        for key in sorted(threads, key=lambda k: (k != main, str(k))):
            self._thread(key, sorted(threads[key], key=lambda e: (e["ts"], -e.get("dur", 0))))
        self._gpu()
        self._thread_edges(main)
        ends = [(op.start_s or 0.0) + (op.duration_s or 0.0) for op in rt.nodes.values()]
        rt.measured_s = max(ends) if ends else 0.0     # before synchronize calls lose their waiting time
        self._syncs()
        self._stream_waits()
        rt.step_start_us = self.t0

    def _thread(self, key, evs) -> None:
        stack: list = []     # (end, event)
        items: list = []     # (ts, end, kind, event, names) ; kind "launch" | "sync" | "op"
        tops: dict = {}      # id(top-level cpu_op) -> [event, launches or waits for GPU work]
        for e in evs:
            ts, end = e["ts"], e["ts"] + e.get("dur", 0)
            while stack and ts >= stack[-1][0]:
                stack.pop()
            cat = e["cat"]
            top = self._top_op(stack)
            if cat in _RUNTIME_CATS:
                kind = self._runtime_kind(key, e)
                if kind:
                    names = tuple(s[1].get("name", "") for s in stack if s[1]["cat"] not in _RUNTIME_CATS)
                    items.append((ts, end, kind, e, names))
                    if top is not None:
                        tops[id(top)][1] = True
            elif cat in _OP_CATS and top is None:
                tops[id(e)] = [e, False]
            stack.append((end, e))
        items += [(t["ts"], t["ts"] + t.get("dur", 0), "op", t, ()) for t, used in tops.values() if not used]
        items.sort(key=lambda it: (it[0], -it[1]))
        chain: list = []
        tid = key[1]
        for ts, end, kind, e, names in items:
            if chain and ts < chain[-1][1]:            # nested in the previous node: same node
                if kind == "launch":
                    self._own_launch(e, chain[-1][2], ts, key, names)
                continue
            nid = self._cpu_node(e, kind, names, tid)
            chain.append((ts, end, nid, kind, e))
            if kind == "launch":
                self._own_launch(e, nid, ts, key, names)
        self.chains[key] = chain
        for (_a0, a1, u, *_), (b0, _b1, v, *_) in zip(chain, chain[1:]):
            self.rt.dep(u, v, DepKind.STREAM, max(0.0, b0 - a1) * _US)

    @staticmethod
    def _top_op(stack):
        for _, s in stack:
            if s["cat"] in _OP_CATS:
                return s
        return None

    def _runtime_kind(self, key, e) -> str | None:
        name, corr = e.get("name", ""), (e.get("args") or {}).get("correlation")
        if corr is not None and corr in self.gpu_by_corr:
            return "launch"
        if name in _SYNC_CALLS:
            return "sync"
        if name in _RECORD_CALLS:
            self.records.setdefault(key, []).append((e["ts"], corr))
            self.record_by_corr[corr] = e
        elif name in _WAIT_CALLS:
            self.waits.append((key, e["ts"], corr))
        return None

    def _own_launch(self, e, nid, ts, key, names) -> None:
        for g in self.gpu_by_corr.get((e.get("args") or {}).get("correlation"), ()):
            self.launch_of[id(g)] = (nid, ts, key, names)

    def _cpu_node(self, e, kind, names, tid) -> str:
        rt = self.rt
        ctx = next((n for n in reversed(names) if n and not _STEP.match(n)), "")
        name = f"{ctx} > {e['name']}" if kind != "op" and ctx else e.get("name", "?")
        nid = f"r{rt.rank}:c{len(rt.nodes)}"
        return rt.add(nid, Op(name=name, kind=OpKind.CPU, rank=rt.rank, stream=f"cpu:{tid}",
                              duration_s=e.get("dur", 0) * _US, start_s=(e["ts"] - self.t0) * _US))

    def _thread_edges(self, main) -> None:
        """Root -> first node of each thread; other threads fork from / join the step thread."""
        rt = self.rt
        main_chain = self.chains.get(main, [])
        main_ends = [c[1] for c in main_chain]
        main_starts = [c[0] for c in main_chain]
        for key, chain in self.chains.items():
            if not chain:
                continue
            first, last = chain[0], chain[-1]
            if key == main or not main_chain:
                rt.dep(rt.root, first[2], DepKind.STREAM if key == main else DepKind.SYNC,
                       max(0.0, first[0] - self.t0) * _US)
                continue
            i = bisect.bisect_right(main_ends, first[0]) - 1      # last main node ended before the fork
            src, t_src = (main_chain[i][2], main_chain[i][1]) if i >= 0 else (rt.root, self.t0)
            rt.dep(src, first[2], DepKind.SYNC, max(0.0, first[0] - t_src) * _US)
            j = bisect.bisect_left(main_starts, last[1])           # first main node after the join
            if j < len(main_chain):
                rt.dep(last[2], main_chain[j][2], DepKind.SYNC, max(0.0, main_chain[j][0] - last[1]) * _US)

    # ------------------------------------------------------------------ GPU side
    def _gpu(self) -> None:
        rt = self.rt
        multi_dev = len(self.devices) > 1
        per_stream: dict = {}
        for e in sorted(self.gpu, key=lambda e: e["ts"]):
            launch = self.launch_of.get(id(e))
            if launch is None and not self.all_events:
                continue                          # launched outside the imported step
            args = e.get("args") or {}
            stream = args.get("stream", e.get("tid"))
            sname = f"cuda{e.get('pid')}:{stream}" if multi_dev else f"cuda:{stream}"
            op = self._gpu_op(e, args, sname, launch)
            nid = rt.add(f"r{rt.rank}:g{len(rt.nodes)}", op)
            self.gpu_nodes.append((e, nid))
            if launch is not None:
                rt.dep(launch[0], nid, DepKind.LAUNCH)
            else:
                rt.dep(rt.root, nid, DepKind.SYNC, max(0.0, e["ts"] - self.t0) * _US)
            per_stream.setdefault((e.get("pid"), stream), []).append(nid)
            if op.is_comm:
                rt.comms.append(nid)
        for nodes in per_stream.values():
            for u, v in zip(nodes, nodes[1:]):
                rt.dep(u, v, DepKind.STREAM)
        # comms in issue (launch) order, the order NCCL sees them
        order = {id(e): (self.launch_of.get(id(e), (None, e["ts"]))[1], e["ts"]) for e, _ in self.gpu_nodes}
        by_nid = {nid: order[id(e)] for e, nid in self.gpu_nodes}
        rt.comms.sort(key=lambda nid: by_nid[nid])

    def _gpu_op(self, e, args, sname, launch) -> Op:
        rt, name = self.rt, e.get("name", "?")
        common = dict(rank=rt.rank, stream=sname, duration_s=e.get("dur", 0) * _US,
                      start_s=(e["ts"] - self.t0) * _US)
        kind = _GPU_CATS[e["cat"]]
        if kind is OpKind.MEMCPY:
            return Op(name=name, kind=kind, bytes=float(args.get("bytes", 0) or 0), **common)
        if not name.startswith(("ncclKernel", "ncclDevKernel")):
            return Op(name=name, kind=kind, kernel=KernelClass.OTHER, **common)
        return self._nccl_op(name, args, launch[3] if launch else (), common)

    def _nccl_op(self, name, args, names, common) -> Op:
        rt = self.rt
        kinds = None
        if args.get("Collective name"):
            kinds = collective_from_name(str(args["Collective name"]))
        for n in reversed(names):
            if kinds is None and n.startswith(("nccl:", "c10d::")):
                kinds = collective_from_name(n.split("::")[-1])
        kinds = kinds or collective_from_kernel(name) or (OpKind.COLLECTIVE, None)
        kind, coll = kinds
        if kind is OpKind.COLLECTIVE and coll is None:
            coll = Collective.ALL_TO_ALL      # bare SendRecv kernel: PyTorch < 2.2 all_to_all
        group = str(args.get("Process Group Name", "0"))
        ranks = parse_rank_list(args.get("Process Group Ranks")) or rt.group_ranks.get(group, ())
        if ranks:
            rt.group_ranks.setdefault(group, ranks)
        size = args.get("Group size")
        group_size = int(size) if isinstance(size, int) else (len(ranks) or rt.world_size or 1)
        elem = dtype_bytes(args.get("dtype"))
        in_b = float(args.get("In msg nelems", 0) or 0) * elem
        out_b = float(args.get("Out msg nelems", 0) or 0) * elem
        return Op(name=name, kind=kind, collective=coll, msg_bytes=msg_bytes_of(coll, kind, in_b, out_b),
                  dtype_bytes=elem, group=group, group_size=group_size, group_stride=stride_of(ranks), **common)

    def comm_calls(self) -> list[bool]:
        """Each c10d collective call of the window in issue order: did it launch an NCCL kernel here?

        An ET records every c10d call; one whose kernel was launched outside the imported window (the
        last all-reduce of the Megatron trace starts 0.2 ms before the step ends and launches after)
        has no Kineto collective, so ET records are matched to calls, not to kernels."""
        launches: dict = {}
        for e, nid in self.gpu_nodes:
            launch = self.launch_of.get(id(e))
            if launch is not None and self.rt.nodes[nid].is_comm:
                launches.setdefault(launch[2], []).append(launch[1])
        for times in launches.values():
            times.sort()
        calls = []
        for e in self.cpu:
            name = str(e.get("name", ""))
            if e["cat"] not in _OP_CATS or not name.startswith("c10d::") or not collective_from_name(name.split("::")[-1]):
                continue
            times = launches.get((e["pid"], e["tid"]), [])
            i = bisect.bisect_left(times, e["ts"])
            calls.append((e["ts"], i < len(times) and times[i] <= e["ts"] + e.get("dur", 0)))
        return [launched for _, launched in sorted(calls)]

    # ------------------------------------------------------------------ synchronisation
    def _syncs(self) -> None:
        """Each synchronize call waits for the GPU op that ended last inside it."""
        rt = self.rt
        if not self.gpu_nodes:
            return
        by_end = sorted(self.gpu_nodes, key=lambda p: p[0]["ts"] + p[0].get("dur", 0))
        ends = [p[0]["ts"] + p[0].get("dur", 0) for p in by_end]
        for key, chain in self.chains.items():
            for ts, end, nid, kind, ev in chain:
                if kind != "sync":
                    continue
                want = self._sync_stream(ev)
                i = bisect.bisect_right(ends, end + 1.0) - 1
                while i >= 0 and ends[i] > ts:
                    e, gid = by_end[i]
                    launch = self.launch_of.get(id(e))
                    stream = (e.get("args") or {}).get("stream", e.get("tid"))
                    if (want is None or stream == want) and (launch is None or launch[0] != nid) \
                            and (launch is None or launch[1] < ts):
                        rt.dep(gid, nid, DepKind.SYNC)
                        rt.nodes[nid] = rt.nodes[nid].with_(duration_s=max(0.0, end - ends[i]) * _US)
                        break
                    i -= 1

    def _sync_stream(self, ev):
        """The stream a synchronize call waits on, from its GPU-side `cuda_sync` twin (None: any)."""
        info = (self.cuda_sync.get((ev.get("args") or {}).get("correlation")) or {}).get("args") or {}
        for k in ("wait_on_stream", "stream"):
            if isinstance(info.get(k), int) and info[k] >= 0:
                return info[k]
        return None

    def _stream_waits(self) -> None:
        """cudaEventRecord (stream A) + cudaStreamWaitEvent (stream B) -> SYNC edge A-op -> B-op."""
        if not self.waits:
            return
        rt = self.rt
        launches = sorted(((l[1], l[2], e, nid) for e, nid in self.gpu_nodes
                           if (l := self.launch_of.get(id(e)))), key=lambda x: x[0])
        times = [x[0] for x in launches]

        def stream_of(e):
            return (e.get("pid"), (e.get("args") or {}).get("stream", e.get("tid")))

        for key, ts, corr in self.waits:
            info = (self.cuda_sync.get(corr) or {}).get("args") or {}
            want_b = info.get("stream")
            want_a = info.get("wait_on_stream")
            target = None
            for x in launches[bisect.bisect_right(times, ts):]:
                if (want_b is None and x[1] == key) or (want_b is not None and stream_of(x[2])[1] == want_b):
                    target = x
                    break
            if target is None:
                continue
            anchor = ts
            rec = self.record_by_corr.get(info.get("wait_on_cuda_event_record_corr_id"))
            if rec is not None:
                anchor = rec["ts"]
            else:
                recs = self.records.get(key, [])
                k = bisect.bisect_left(recs, (ts,)) - 1
                if k >= 0:
                    anchor = recs[k][0]
            b = stream_of(target[2])
            for x in reversed(launches[:bisect.bisect_left(times, anchor)]):
                a = stream_of(x[2])
                if a[0] == b[0] and a != b and (want_a is None or a[1] == want_a):
                    if x[3] != target[3]:
                        rt.dep(x[3], target[3], DepKind.SYNC)
                    break
