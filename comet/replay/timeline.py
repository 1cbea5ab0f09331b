"""Chrome-trace (Perfetto) export of a replayed step: one process per pipeline stage (its
representative rank), one thread per stream; task-level slices always, op-level slices expanded from
the block replays (each block was replayed once; its ops are placed at every occurrence)."""

from __future__ import annotations

import json
from pathlib import Path

from comet.replay.schedule import FWD, block_occurrences, task_blocks
from comet.replay.step import StepReplay

US = 1e6


def step_timeline(rep: StepReplay, plan=None, max_events: int = 1_000_000) -> list[dict]:
    """Chrome-trace events; op-level slices when the block replays were kept and fit in max_events."""
    plan = plan or rep.plan
    prog, end = rep.tasks()
    pp = len(prog.offset) - 1
    events: list[dict] = []
    for s in range(pp):
        events.append({"ph": "M", "name": "process_name", "pid": s, "args": {"name": f"stage {s} (rank)"}})
    ops_per_block = {k: (len(b.replay.compiled) if b.replay else 0) for k, b in rep.blocks.items()}
    op_events = sum(n * ops_per_block[k] for s in range(pp) for k, n in block_occurrences(plan, s).items())
    expand_ops = all(b.replay is not None for b in rep.blocks.values() if b.duration_s > 0) and \
        op_events <= max_events
    for s in range(pp):
        for i in range(prog.offset[s], prog.offset[s + 1]):
            ph, c, mb = int(prog.phase[i]), int(prog.chunk[i]), int(prog.mb[i])
            start = float(end[i] - prog.dur[i])
            name = f"{'F' if ph == FWD else 'B'} mb{mb}" + (f" chunk{c}" if plan.vpp > 1 else "")
            events.append({"ph": "X", "name": name, "cat": "task", "pid": s, "tid": "pipeline",
                           "ts": start * US, "dur": float(prog.dur[i]) * US, "args": {"microbatch": mb, "chunk": c}})
            if expand_ops:
                t = start
                for key in task_blocks(plan, s, c, ph):
                    b = rep.blocks[key]
                    if b.replay is not None:
                        r = b.replay
                        for j, op in enumerate(r.compiled.ops):
                            events.append({"ph": "X", "name": op.name, "cat": op.kind.value, "pid": s, "tid": op.stream,
                                           "ts": (t + r.start[j]) * US, "dur": (r.end[j] - r.start[j]) * US,
                                           "args": {"block": key, "microbatch": mb}})
                    t += b.duration_s
        tail = rep.tails[s]
        for name, a, b in tail.dp_events:
            events.append({"ph": "X", "name": name, "cat": "collective", "pid": s, "tid": "comm.dp",
                           "ts": a * US, "dur": (b - a) * US})
        events.append({"ph": "X", "name": "optimizer", "cat": "compute", "pid": s, "tid": "compute",
                       "ts": tail.optimizer_start * US, "dur": (tail.optimizer_end - tail.optimizer_start) * US})
    return events


def write_chrome_trace(events: list[dict], path: str | Path) -> None:
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
