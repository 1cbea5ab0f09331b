"""Executors run chunks of candidates and hand results back in completion order.

SerialExecutor evaluates in this process (debugging, tests). RayExecutor runs each chunk as a Ray
task: the shared context goes into the object store once (`ray.put`), results come back through
`ray.wait`; a chunk whose worker died is retried once candidate by candidate, and a candidate that
kills its worker twice is recorded with status error. Ray is imported here and in ray_runtime.py (how
the local Ray starts or a cluster is joined) only.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable

from comet.result import CandidateStatus, Result
from comet.search.context import Candidate, EvalContext, evaluate_chunk
from comet.search.records import Finished, finish

Done = list[Finished]   # journal line and table row of each candidate of a chunk


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
        return _finished(self.ctx, self._queue.popleft(), 1)

    def cancel(self) -> None:
        self._queue.clear()

    def side(self, fn: Callable, *args) -> Callable[[], Any]:
        """Work for the study's outputs, fn(context, *args): here, at once (see RayExecutor.side)."""
        value = fn(self.ctx, *args)
        return lambda: value

    def prepare(self, fn: Callable) -> None:
        """Nothing to prepare in this process (see RayExecutor.prepare)."""

    def share(self, obj: Any) -> Any:
        """An argument for several side() calls (see RayExecutor.share)."""
        return obj

    def close(self, wait: bool = True) -> None:
        self._queue.clear()

    def join(self) -> None:
        pass


_worker_ctx: dict = {}    # in a Ray worker: the study's context, unpickled once (ObjectRef hex -> context)


def _context(box: list) -> EvalContext:
    """The context of `box` ([ObjectRef], so Ray does not unpickle it for every task), one object per
    worker: the evaluation caches key the base graph and clusters by identity, so every task of the
    worker reuses what the earlier ones computed."""
    key = box[0].hex()
    ctx = _worker_ctx.get(key)
    if ctx is None:
        import ray
        _worker_ctx.clear()     # one study at a time per worker
        ctx = _worker_ctx[key] = ray.get(box[0])
    return ctx


def _finished(ctx: EvalContext, chunk: list[Candidate], attempt: int) -> Done:
    return [finish(c, r, attempt, ctx.fingerprint) for c, (_, r) in zip(chunk, evaluate_chunk(ctx, chunk))]


def _run_chunk(box: list, chunk: list[Candidate], attempt: int) -> Done:
    return _finished(_context(box), chunk, attempt)


def _side(box: list, fn: Callable, *args):
    return fn(_context(box), *args)


def _warm(box: list) -> None:
    """Run once per worker while the driver lists the candidates: unpickles the context and imports
    the evaluation code, so the first chunk does not pay for them."""
    if _context(box).evaluate_fn is None:
        import comet.evaluate  # noqa: F401


class _Shared(int):
    """A handle of RayExecutor.share."""


class RayExecutor:
    """Chunks as Ray tasks, on a private local Ray with `workers` CPUs or on the cluster at `address`
    (comet/search/ray_runtime.py). `where` says which, for the run's first line and summary.md."""

    name = "ray"

    def __init__(self, ctx: EvalContext, workers: int | None = None, address: str | None = None):
        import threading

        import ray

        self._ray = ray
        self._started = False
        self._cleanup = None
        self._sigterm = None
        self._ctx = ctx
        self._pending: dict = {}                  # ObjectRef -> (chunk, attempt)
        self._prepared: list = []                 # refs of prepare() tasks (kept until close)
        self._sides: list[list] = []              # [ref] of each side() task, emptied when its value is taken
        self._shared: dict = {}                   # share(): handle -> (object, its ObjectRef)
        self._failure: BaseException | None = None
        self._catch_sigterm()
        # perf: Ray takes seconds to start; the driver lists and prunes the candidates meanwhile, and the
        # first look at `where`, `workers` or `capacity` waits for it (and raises what the start raised).
        # The thread lives until close(): Ray's processes die with the thread that spawned them (Linux
        # PR_SET_PDEATHSIG is per thread)
        self._up, self._done = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._start, args=(ctx, workers, address), daemon=True,
                                        name="comet-ray-start")
        self._thread.start()

    def _start(self, ctx: EvalContext, workers: int | None, address: str | None) -> None:
        import logging

        from comet.search import ray_runtime

        ray = self._ray
        quiet = logging.getLogger("ray._private.worker")   # warns that a thread sets no SIGTERM handler:
        level = quiet.level                                # this executor's own handler does that
        quiet.setLevel(logging.ERROR)
        try:
            if ray.is_initialized():          # a caller's own Ray session (notebook, tests): used as it is
                where = f"the Ray session already open in this process ({ray.get_runtime_context().gcs_address})"
            elif address:
                where = ray_runtime.join(ray, address).describe()
                self._started = True
            else:
                placement, self._cleanup = ray_runtime.start_local(ray, workers)
                where = placement.describe()
                self._started = True
            cpus = int(ray.cluster_resources().get("CPU", 1))
            self._where, self._workers = where, workers or cpus
            self._ctx_box = [ray.put(ctx)]            # model, cluster, base graph: shipped once
            self._remote = ray.remote(num_cpus=1, max_retries=0)(_run_chunk)
            self._side = ray.remote(num_cpus=1, max_retries=0)(_side)
            warm = ray.remote(num_cpus=1, max_retries=0)(_warm)
            self._warming = [warm.remote(self._ctx_box) for _ in range(self._workers)]   # not waited for
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            self._failure = exc
        finally:
            quiet.setLevel(level)
            self._up.set()
        self._done.wait()
        try:                                      # close(): shut down here, beside the driver's writing
            if self._cleanup is not None:         # the private Ray this executor started
                ray_runtime.stop_helpers(self._ray)
            if self._started:
                self._ray.shutdown()
        except BaseException as exc:  # noqa: BLE001 - raised again by join()
            self._failure = exc
        finally:
            if self._cleanup is not None:
                self._cleanup()

    def _ready(self) -> None:
        while not self._up.wait(0.1):     # in steps: a Ctrl-C or kill is not held up
            pass
        if self._failure is not None:
            raise self._failure

    @property
    def where(self) -> str:
        self._ready()
        return self._where

    @property
    def workers(self) -> int:
        self._ready()
        return self._workers

    @property
    def capacity(self) -> int:
        return 2 * self.workers                   # two chunks per worker keep every worker busy

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
        self._ready()
        ref = self._remote.remote(self._ctx_box, chunk, attempt)
        self._pending[ref] = (chunk, attempt)

    def wait(self) -> Done:
        """Results of the next chunk to finish (possibly empty when a crashed chunk was resubmitted)."""
        ready, _ = self._ray.wait(list(self._pending), num_returns=1)
        ref = ready[0]
        chunk, attempt = self._pending.pop(ref)
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            return self._crashed(chunk, attempt, exc)

    def _crashed(self, chunk: list[Candidate], attempt: int, exc: Exception) -> Done:
        if attempt == 1:
            for cand in chunk:        # retry once, one candidate per task, to isolate the culprit
                self.submit([cand], attempt=2)
            return []
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = f"worker crashed twice ({type(exc).__name__}: {first[:200]})"
        return [finish(c, Result(status=CandidateStatus.ERROR, reason=reason, label=c.parallel.label(),
                                 gpus=c.parallel.gpus or 0), attempt, self._ctx.fingerprint) for c in chunk]

    def side(self, fn: Callable, *args) -> Callable[[], Any]:
        """fn(context, *args) as a Ray task, for the study's outputs (plots, timelines) once every chunk
        is back: the driver writes the tables meanwhile and calls the returned function for the value.
        A task that failed (its worker died, or fn raised) runs again here, so a failure is what the
        serial executor would give."""
        self._ready()
        # the ref is held here, not by the caller: cancel() drops it before Ray shuts down (a ref freed
        # after the shutdown ends the process)
        box = [self._side.remote(self._ctx_box, fn, *[self._shared[a][1] if isinstance(a, _Shared) else a
                                                       for a in args])]
        self._sides.append(box)
        local = [self._shared[a][0] if isinstance(a, _Shared) else a for a in args]   # no ref in the closure

        def value():
            try:
                if box:
                    return self._ray.get(box[0])
            except self._ray.exceptions.RayError:
                pass
            finally:
                box.clear()
            return fn(self._ctx, *local)
        return value

    def share(self, obj: Any) -> "_Shared":
        """obj in the object store once, for several side() calls (Ray gives their tasks the value). The
        caller holds a plain handle: every ObjectRef stays here, dropped by cancel() before Ray shuts down."""
        self._ready()
        handle = _Shared(len(self._shared))
        self._shared[handle] = (obj, self._ray.put(obj))
        return handle

    def prepare(self, fn: Callable) -> None:
        """fn(context) once per worker, not waited for: submitted when the last chunk is, it runs as
        workers run out of chunks (imports for the outputs' side tasks)."""
        self._ready()
        self._prepared += [self._side.remote(self._ctx_box, fn) for _ in range(self._workers)]

    def cancel(self) -> None:
        for ref in list(self._pending):
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished or worker gone
                pass
        self._pending.clear()
        self._prepared.clear()
        for box in self._sides:
            box.clear()
        self._sides.clear()
        self._shared.clear()

    def close(self, wait: bool = True) -> None:
        """Shut Ray down (a start still going finishes first); with wait=False in the background:
        join() waits for it."""
        self.cancel()
        self._up.wait()
        self._failure = None                      # a failed start was raised already
        self._done.set()
        if self._sigterm is not None:
            import signal
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        if wait:
            self.join()

    def join(self) -> None:
        self._thread.join()
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure


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
