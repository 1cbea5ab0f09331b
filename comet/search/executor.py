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
    where = where_now = "this process (serial executor)"

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

    def close(self, wait: bool = True) -> None:
        self._queue.clear()

    def join(self) -> None:
        pass

    def where_at_end(self) -> str:
        return self.where


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


def _run_chunk(box: list, chunk: list[Candidate]):
    return evaluate_chunk(_context(box), chunk)


def _warm(box: list) -> None:
    """Run once per worker while the driver lists the candidates: unpickles the context and imports
    the evaluation code, so the first chunk does not pay for them."""
    if _context(box).evaluate_fn is None:
        import comet.evaluate  # noqa: F401


class RayExecutor:
    """Chunks as Ray tasks, on a private local Ray with `workers` CPUs or on the cluster at `address`
    (comet/search/ray_runtime.py). `where` says which, for the run's first line and summary.md.

    perf: a private local Ray takes seconds to start (3-10 s on a 2-core machine); meanwhile this process
    evaluates the chunks itself, one at a time, as the serial executor does, and keeps doing so until
    the workers have loaded the evaluation code. Results are the same wherever a chunk runs (the
    evaluation is pure; tests/search/test_end_to_end.py compares the tables). A chunk evaluated here is
    not isolated from a crash of the process, as with --executor serial; a chunk a worker runs is."""

    name = "ray"

    def __init__(self, ctx: EvalContext, workers: int | None = None, address: str | None = None,
                 help_while_starting: bool | None = None):
        import os
        import threading

        import ray

        self._ray = ray
        self._started = False
        self._cleanup = None
        self._sigterm = None
        self._pending: dict = {}                  # ObjectRef -> (chunk, attempt)
        self._local: deque[list[Candidate]] = deque()   # chunks this process evaluates (Ray still starting)
        self._local_done = 0
        self._ctx = ctx
        self._failure: BaseException | None = None
        # default: help only a private local Ray (a caller's open session or a cluster is up already)
        self._help = (address is None and not ray.is_initialized()) if help_while_starting is None \
            else help_while_starting
        self._warm_done = not self._help
        self._planned = workers or (os.cpu_count() or 1) if address is None else None
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
            if self._done.is_set():                   # the study ended while Ray started: nothing to ship
                raise _Unused
            self._ctx_box = [ray.put(ctx)]            # model, cluster, base graph: shipped once
            self._remote = ray.remote(num_cpus=1, max_retries=0)(_run_chunk)
            warm = ray.remote(num_cpus=1, max_retries=0)(_warm)
            self._warming = [warm.remote(self._ctx_box) for _ in range(self._workers)]   # not waited for
        except _Unused:
            pass
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            if not (self._help and self._done.is_set()):   # not when this process did every chunk itself
                self._failure = exc
        finally:
            quiet.setLevel(level)
            self._up.set()
        self._done.wait()
        try:                                      # close(): shut down here, beside the driver's writing
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
    def where_now(self) -> str:
        """`where` without waiting for a local Ray still starting."""
        if self._help and not self._up.is_set():
            return (f"a private local Ray with {self._planned} workers, starting (this process evaluates "
                    "chunks until they are up)")
        return self.where

    def where_at_end(self) -> str:
        """Where the candidates ran, for summary.md (after the evaluation)."""
        if not self._help:
            return self.where
        here = f"{self._local_done} candidates evaluated in this process while Ray started"
        if not self._up.is_set() or self._failure is not None:
            return f"this process ({here}; the private local Ray was not up before the last candidate)"
        return f"{self._where}; {here}" if self._local_done else self._where

    @property
    def workers(self) -> int:
        self._ready()
        return self._workers

    @property
    def planned_workers(self) -> int:
        """The worker count, without waiting for a local Ray to start (chunk sizing)."""
        return self._planned or self.workers

    @property
    def starting(self) -> bool:
        """True while this process evaluates chunks itself: Ray is not up, or its workers are still
        loading the evaluation code."""
        if not self._help or self._warm_done:
            return False
        if not self._up.is_set():
            return True
        if self._failure is None:
            done, _ = self._ray.wait(self._warming, num_returns=len(self._warming), timeout=0)
            self._warm_done = len(done) == len(self._warming)
        else:
            self._warm_done = True
        return not self._warm_done

    @property
    def capacity(self) -> int:
        if self._help and not self._up.is_set():
            return 1                              # one chunk at a time, evaluated here
        # two chunks per worker keep every worker busy, plus one here while the workers warm up
        return 2 * self.workers + (1 if self.starting else 0)

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
        return len(self._pending) + len(self._local)

    def submit(self, chunk: list[Candidate], attempt: int = 1) -> None:
        if attempt == 1 and not self._local and self.starting:
            self._local.append(chunk)
            return
        self._ready()
        ref = self._remote.remote(self._ctx_box, chunk)
        self._pending[ref] = (chunk, attempt)

    def wait(self) -> Done:
        """Results of the next chunk to finish (possibly empty when a crashed chunk was resubmitted): a
        worker's if one is done, else the chunk kept here, evaluated now."""
        if self._local:
            ready = self._ray.wait(list(self._pending), num_returns=1, timeout=0)[0] if self._pending else []
            if not ready:
                chunk = self._local.popleft()
                self._local_done += len(chunk)
                return [(c, r, 1) for c, (_, r) in zip(chunk, evaluate_chunk(self._ctx, chunk))]
        else:
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
        self._local.clear()
        for ref in list(self._pending):
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished or worker gone
                pass
        self._pending.clear()

    def close(self, wait: bool = True) -> None:
        """Shut Ray down (a start still going finishes first); with wait=False in the background:
        join() waits for it."""
        self.cancel()
        if not self._help:
            self._up.wait()
        # a failed start was raised already, or (helping) this process evaluated every chunk itself;
        # a failure of the shut-down is still raised by join()
        self._failure = None
        self._done.set()                          # a start still going shuts down as soon as it is up
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


class _Unused(Exception):
    """Ray came up after the study ended: nothing is shipped, it only shuts down."""


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
