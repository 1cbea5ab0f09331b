"""Executors run chunks of candidates and hand results back in completion order.

SerialExecutor evaluates in this process (debugging, tests). RayExecutor runs each chunk as a Ray
task: the shared context goes into the object store once (`ray.put`), results come back through
`ray.wait`; a chunk whose worker died is retried once candidate by candidate, and a candidate that
kills its worker twice is recorded with status error. Ray is imported here and in ray_runtime.py (how
the local Ray starts or a cluster is joined) only.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

from comet.result import CandidateStatus, Result
from comet.search.context import Candidate, EvalContext, evaluate_chunk

Done = list[tuple[Candidate, Result, int]]   # (candidate, result, attempts)


class SerialExecutor:
    """Evaluates one submitted chunk per `wait()`, in submission order."""

    name = "serial"
    where = "this process (serial executor)"

    def __init__(self, ctx: EvalContext):
        self.ctx = ctx
        self.capacity = 1
        self._queue: deque[list[Candidate]] = deque()

    @property
    def in_flight(self) -> int:
        return len(self._queue)

    def submit(self, chunk: list[Candidate]) -> None:
        self._queue.append(chunk)

    def wait(self) -> Done:
        chunk = self._queue.popleft()
        return [(c, r, 1) for c, (_, r) in zip(chunk, evaluate_chunk(self.ctx, chunk))]

    def cancel(self) -> None:
        self._queue.clear()

    def close(self) -> None:
        self._queue.clear()


def _run_chunk(ctx: EvalContext, chunk: list[Candidate]):
    return evaluate_chunk(ctx, chunk)


def _warm(ctx: EvalContext) -> None:
    """Run once per worker while the driver lists the candidates: imports the evaluation code, so the
    first chunk does not pay for it."""
    if ctx.evaluate_fn is None:
        import comet.evaluate  # noqa: F401


class RayExecutor:
    """Chunks as Ray tasks, on a private local Ray with `workers` CPUs or on the cluster at `address`
    (comet/search/ray_runtime.py). `where` says which, for the run's first line and summary.md."""

    name = "ray"

    def __init__(self, ctx: EvalContext, workers: int | None = None, address: str | None = None):
        import ray

        from comet.search import ray_runtime

        self._ray = ray
        self._started = False
        self._cleanup = None
        self._sigterm = None
        if ray.is_initialized():          # a caller's own Ray session (notebook, tests): used as it is
            self.where = f"the Ray session already open in this process ({ray.get_runtime_context().gcs_address})"
        elif address:
            self.where = ray_runtime.join(ray, address).describe()
            self._started = True
        else:
            placement, self._cleanup = ray_runtime.start_local(ray, workers)
            self.where = placement.describe()
            self._started = True
        self._catch_sigterm()
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = workers or cpus
        self.capacity = 2 * self.workers          # two chunks per worker keep every worker busy
        self._ctx_ref = ray.put(ctx)              # model, cluster, base graph: shipped once
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_run_chunk)
        self._pending: dict = {}                  # ObjectRef -> (chunk, attempt)
        warm = ray.remote(num_cpus=1, max_retries=0)(_warm)
        self._warming = [warm.remote(self._ctx_ref) for _ in range(self.workers)]   # not waited for

    def _catch_sigterm(self) -> None:
        """A `kill PID` of the search ends it like Ctrl-C: results saved, Ray shut down, no orphans."""
        import signal
        import threading
        if threading.current_thread() is not threading.main_thread():
            return

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        self._sigterm = signal.signal(signal.SIGTERM, interrupt)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def submit(self, chunk: list[Candidate], attempt: int = 1) -> None:
        ref = self._remote.remote(self._ctx_ref, chunk)
        self._pending[ref] = (chunk, attempt)

    def wait(self) -> Done:
        """Results of the next chunk to finish (possibly empty when a crashed chunk was resubmitted)."""
        ready, _ = self._ray.wait(list(self._pending), num_returns=1)
        ref = ready[0]
        chunk, attempt = self._pending.pop(ref)
        try:
            out = self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            return self._crashed(chunk, attempt, exc)
        return [(c, r, attempt) for c, (_, r) in zip(chunk, out)]

    def _crashed(self, chunk: list[Candidate], attempt: int, exc: Exception) -> Done:
        if attempt == 1:
            for cand in chunk:        # retry once, one candidate per task, to isolate the culprit
                self.submit([cand], attempt=2)
            return []
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = f"worker crashed twice ({type(exc).__name__}: {first[:200]})"
        return [(c, Result(status=CandidateStatus.ERROR, reason=reason, label=c.parallel.label(),
                           gpus=c.parallel.gpus or 0), attempt) for c in chunk]

    def cancel(self) -> None:
        for ref in list(self._pending):
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished or worker gone
                pass
        self._pending.clear()

    def close(self) -> None:
        self.cancel()
        if self._started:
            self._ray.shutdown()
        if self._cleanup is not None:
            self._cleanup()
        if self._sigterm is not None:
            import signal
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None


def make_executor(kind: str, ctx: EvalContext, workers: int | None, address: str | None):
    if kind == "serial":
        return SerialExecutor(ctx)
    return RayExecutor(ctx, workers=workers, address=address)


def chunks(items: Iterable[Candidate], size: int) -> Iterable[list[Candidate]]:
    buf: list[Candidate] = []
    for item in items:
        buf.append(item)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf
