"""`comet trace import`, `comet trace replay` and `comet trace transform`: profiler traces in, op graph /
replay report / rescaled replay out."""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from comet.cli.argtypes import non_negative_float, positive_int
from comet.errors import ConfigError, TraceError
from comet.graph.ir import ops


def register(subparsers) -> None:
    p = subparsers.add_parser("trace", help="import and replay PyTorch profiler / ET / Chakra traces")
    sub = p.add_subparsers(dest="trace_command", required=True, parser_class=type(p))

    imp = sub.add_parser("import", help="import traces into comet's op graph (and export Chakra ET)")
    _inputs(imp)
    imp.add_argument("-o", "--output", help="write the graph as comet graph JSON (readable by `trace replay`)")
    imp.add_argument("--chakra-out", metavar="DIR", help="write one Chakra ET <prefix>.<rank>.et per rank")
    imp.add_argument("--chakra-prefix", default="comet", help="file prefix for --chakra-out (default: comet)")
    imp.add_argument("--json", action="store_true", help="print a JSON summary")
    imp.set_defaults(func=run_import)

    rep = sub.add_parser("replay", help="replay a trace and compare with the measured iteration time")
    _inputs(rep)
    rep.add_argument("--json", action="store_true", help="print one JSON object")
    rep.add_argument("--timeline", metavar="OUT.json", help="write the replayed timeline as a Chrome trace")
    rep.add_argument("--overlap-slowdown", type=non_negative_float, default=0.0,
                     help="compute slowdown while communication is in flight (default 0: measured kernels)")
    rep.add_argument("--top", type=positive_int, default=10, help="critical-path ops to list (default 10)")
    rep.set_defaults(func=run_replay)

    ins = sub.add_parser("inspect", help="recognise the LLM training step in a trace: layers, shape, layout, "
                                         "phases, per-layer and per-role measured times")
    ins.add_argument("paths", nargs="+", help="Kineto trace files or directories (with their PyTorch ETs)")
    ins.add_argument("--step", default=None, help="ProfilerStep number (default: the last complete one)")
    ins.add_argument("--json", action="store_true", help="print one JSON object")
    ins.set_defaults(func=run_inspect)

    tr = sub.add_parser("transform", help="rescale a trace (hardware, precision, data-parallel degree) and "
                                          "replay it against the original")
    _inputs(tr)
    tr.add_argument("--dp", type=positive_int, help="data-parallel degree: re-size and re-time the DP group's collectives")
    tr.add_argument("--dp-group", action="append", default=[], metavar="NAME",
                    help="process group that is the data-parallel group (repeatable; default: groups marked "
                         "DP, else those spanning every rank)")
    tr.add_argument("--cluster", metavar="SPEC.yaml", help="target cluster spec: re-time every kernel for it")
    tr.add_argument("--from-cluster", metavar="SPEC.yaml",
                    help="cluster spec the trace was measured on (required with --dp/--cluster/--precision)")
    tr.add_argument("--precision", help="GEMM precision to move to: bf16, fp16 or fp8")
    tr.add_argument("--from-precision", help="GEMM precision of the trace (default: recorded in the graph, else bf16)")
    tr.add_argument("--tp", type=positive_int, help="tensor-parallel degree (needs layer annotations: not on flat traces)")
    tr.add_argument("--pp", type=positive_int, help="pipeline-parallel degree (needs layer annotations: not on flat traces)")
    tr.add_argument("-o", "--output", help="write the transformed graph as comet graph JSON (for `trace replay`)")
    tr.add_argument("--json", action="store_true", help="print one JSON object")
    tr.add_argument("--timeline", metavar="OUT.json", help="write the transformed replay as a Chrome trace")
    tr.add_argument("--overlap-slowdown", type=non_negative_float, default=0.0,
                    help="compute slowdown while communication is in flight (default 0, as `trace replay`)")
    tr.set_defaults(func=run_transform)


def _inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", help="trace files, directories, archives, or a comet graph JSON")
    p.add_argument("--step", default=None,
                   help="ProfilerStep number to import, or 'all' (default: the last complete step)")
    p.add_argument("--no-et-sizes", action="store_true", help="do not read collective sizes from PyTorch ETs")


def _step(value):
    if value is None or value == "all":
        return value
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"must be a step number or 'all', got {value!r}", field="--step") from None


def _load(args):
    from comet.trace import load_trace
    return load_trace(args.paths, step=_step(args.step), sizes_from_et=not args.no_et_sizes)


def summarize(g) -> dict:
    kinds = collections.Counter((op.rank, op.kind.value) for _, op in ops(g))
    comms = {op.comm_id for _, op in ops(g) if op.comm_id}
    info = {r["rank"]: r for r in g.graph.get("ranks", [])}
    ranks = []
    for r in sorted({rank for rank, _ in kinds}):
        row = {"rank": r, **{k: n for (rr, k), n in sorted(kinds.items()) if rr == r}}
        row.update({k: info.get(r, {}).get(k) for k in ("file", "step", "measured_s")})
        ranks.append(row)
    return {"nodes": g.number_of_nodes(), "edges": g.number_of_edges(), "matched_comms": len(comms),
            "formats": g.graph.get("source"), "ranks": ranks}


def run_import(args) -> int:
    g = _load(args)
    written = []
    if args.output:
        from comet.trace import write_graph_json
        write_graph_json(g, args.output)
        written.append(args.output)
    if args.chakra_out:
        from comet.trace import write_chakra
        written += [str(p) for p in write_chakra(g, args.chakra_out, args.chakra_prefix)]
    summary = {**summarize(g), "written": written}
    if args.json:
        print(json.dumps(summary))
        return 0
    console = Console()
    table = Table(title=f"{summary['nodes']} ops, {summary['edges']} deps, {summary['matched_comms']} matched "
                        f"collectives ({', '.join(summary['formats'] or [])})")
    for col in ("rank", "cpu", "compute", "memcpy", "collective", "step", "measured ms"):
        table.add_column(col, justify="right" if col != "step" else "left")
    for r in summary["ranks"]:
        meas = r.get("measured_s")
        table.add_row(str(r["rank"]), *(str(r.get(k, 0)) for k in ("cpu", "compute", "memcpy", "collective")),
                      str(r.get("step") or "-"), f"{meas * 1e3:.3f}" if meas is not None else "-")
    console.print(table)
    for path in written:
        console.print(f"wrote {path}")
    return 0


def run_replay(args) -> int:
    from comet.trace.replay import replay_trace, timeline, timing_gaps
    g = _load(args)
    timed, notes = timing_gaps(g)
    if not timed:   # every op would replay as 0 s: refuse rather than print a 0.000 ms step
        raise TraceError("no op has a measured duration (a host-only execution trace, or a Chakra trace without "
                         "durations), so the replay would be 0 s" + (f"; {notes[-1]}" if notes else ""),
                         path=" ".join(args.paths))
    for note in notes:
        print(f"comet: warning: {note}", file=sys.stderr)
    report = replay_trace(g, overlap_slowdown=args.overlap_slowdown, top=args.top)
    if args.timeline:
        Path(args.timeline).write_text(json.dumps(timeline(report.replay)))
    if args.json:
        print(json.dumps({**report.to_dict(), "warnings": notes}))
        return 0
    console = Console()
    table = Table(title="trace replay: predicted vs measured iteration time"
                        + (" (ranks started at their measured offsets)" if report.aligned else ""))
    for col in ("rank", "measured ms", "predicted ms", "error %"):
        table.add_column(col, justify="right")

    def fmt(x, scale=1e3, spec=".3f"):
        return "-" if x is None else format(x * scale, spec)

    for r in report.ranks:
        table.add_row(str(r.rank), fmt(r.measured_s), fmt(r.predicted_s), fmt(r.error_pct, 1, "+.2f"))
    table.add_row("all", fmt(report.measured_s), fmt(report.predicted_s), fmt(report.error_pct, 1, "+.2f"))
    console.print(table)
    path = Table(title=f"critical path: {report.critical_path_len} ops; longest")
    for col in ("op", "rank", "stream", "kind", "start ms", "dur ms"):
        path.add_column(col, justify="left" if col in ("op", "stream", "kind") else "right")
    for row in report.critical_path:
        path.add_row(row["name"][:70], str(row["rank"]), row["stream"], row["kind"], fmt(row["start_s"]),
                     fmt(row["duration_s"]))
    console.print(path)
    if args.timeline:
        console.print(f"wrote {args.timeline}")
    return 0


def run_inspect(args) -> int:
    from comet.trace.recognize import recognize
    rec = recognize(args.paths if len(args.paths) > 1 else args.paths[0], step=_step(args.step))
    d = rec.as_dict()
    if args.json:
        print(json.dumps(d))
        return 0
    con = Console()
    t = Table(title=f"trace inspect: {rec.source}")
    t.add_column("field")
    t.add_column("value")
    t.add_column("how")
    for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "activation", "seq_len", "micro_batch",
              "vocab", "tp", "dp", "dtype"):
        t.add_row(k, str(d[k]) if d[k] is not None else "-", d["how"].get(k, d["layers_from"] if k == "layers" else ""))
    t.add_row("ranks", f"{len(rec.ranks)} ({', '.join(map(str, rec.ranks))})", f"world {rec.world_size}")
    t.add_row("phases", ", ".join(rec.phases), "")
    t.add_row("streams", "; ".join(f"{k}: {v}" for k, v in rec.streams.items()), "")
    t.add_row("step", f"{rec.step_ms:.3f} ms", "rank 0, the imported iteration")
    if rec.per_layer_ms:
        pl = rec.per_layer_ms
        t.add_row("per layer", f"{min(pl):.3f} .. {max(pl):.3f} ms (median {sorted(pl)[len(pl) // 2]:.3f})",
                  "forward of each layer, rank 0 (GPU: compute kernels)")
    con.print(t)
    if rec.role_ms:
        r = Table(title="measured time per op role (ms per occurrence; layer roles per layer)")
        r.add_column("role")
        r.add_column("ms", justify="right")
        for k, v in rec.role_ms.items():
            r.add_row(k, f"{v:.4f}")
        for k, v in rec.unattributed_ms.items():
            r.add_row(f"(unattributed: {k})", f"{v:.3f}")
        con.print(r)
    for k, why in rec.unrecognised.items():
        con.print(f"not recognised: {k}: {why}")
    return 0


def run_transform(args) -> int:
    from comet.config.cluster import load_cluster
    from comet.trace import write_graph_json
    from comet.trace.replay import timeline
    from comet.trace.rescale import Rescale, compare, json_safe
    how = Rescale(dp=args.dp, precision=args.precision, from_precision=args.from_precision,
                  cluster=load_cluster(args.cluster) if args.cluster else None,
                  from_cluster=load_cluster(args.from_cluster) if args.from_cluster else None,
                  dp_groups=tuple(args.dp_group), tp=args.tp, pp=args.pp)
    how.check()                               # bad options fail before the trace is read
    cmp = compare(_load(args), how, overlap_slowdown=args.overlap_slowdown)
    if args.output:
        write_graph_json(json_safe(cmp.result.graph), args.output)
        cmp.written.append(args.output)
    if args.timeline:
        Path(args.timeline).write_text(json.dumps(timeline(cmp.transformed.replay)))
        cmp.written.append(args.timeline)
    if args.json:
        print(json.dumps(cmp.to_dict()))
        return 0
    _print_transform(cmp.to_dict())
    return 0


def _print_transform(d: dict) -> None:
    console = Console()
    title = "trace transform: " + ("; ".join(d["transforms"]) or "identity (no transformation)")
    table = Table(title=title)
    for col in ("rank", "measured ms", "original ms", "transformed ms", "ratio"):
        table.add_column(col, justify="right")

    def fmt(x, scale=1e3, spec=".3f"):
        return "-" if x is None else format(x * scale, spec)

    for r in d["ranks"] + [d["overall"]]:
        table.add_row(str(r["rank"]), fmt(r["measured_s"]), fmt(r["original_predicted_s"]),
                      fmt(r["transformed_predicted_s"]), fmt(r["ratio"], 1, ".4f"))
    console.print(table)
    ch = d["changed"]
    retimed = ", ".join(f"{n} {k}" for k, n in ch["retimed"].items() if n) or "none"
    console.print(f"re-timed ops: {retimed}; collectives re-sized: {ch['resized_collectives']}"
                  + (f"; kept measured (not modelled): {ch['kept_unmodelled']}" if ch.get("kept_unmodelled") else ""))
    for kind, s in d["sums"].items():
        if s["original_s"]:
            console.print(f"  summed {kind}: {s['original_s'] * 1e3:.3f} ms -> {s['transformed_s'] * 1e3:.3f} ms")
    for path in d["written"]:
        console.print(f"wrote {path}")
