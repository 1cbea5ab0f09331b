"""Where a study's Ray runs: a private local Ray, or an existing cluster given by `--address`.

Private local Ray (the default): `address="local"` never joins a cluster started with `ray start` (Ray's
default `ray.init()` joins the one named in /tmp/ray/ray_current_cluster); its own temp dir, so nothing
else finds it either; no dashboard; node IP 127.0.0.1 with the GCS and raylet bound to loopback
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray 2.x use the loopback address it otherwise replaces by the
host's IP); token authentication with a token made for this run.

A watchdog process (ray_reaper.py) kills the private Ray's processes if the search is killed outright.

Joining (`--address HOST:PORT` or `auto`): the address is probed over TCP first, so an unreachable one
fails in seconds with one line instead of Ray's ~80 s of retries; a token-auth cluster (Ray's default
since 2.5x) is joined with the local token (~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH) as
`ray.init(address="auto")` does, which Ray does not do for an explicit address. Ray's C++ retry lines are
kept out of the terminal and summarized in the one-line error.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from comet.errors import ConfigError

PROBE_TIMEOUT_S = 3.0
_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}   # read by ray_constants at import
# Ray starts its workers at nice 15 (read by the raylet, as Ray's job manager sets it to 0 for jobs):
# the study's workers would then get a fraction of a core beside any other process on the machine,
# while the serial executor runs at the normal priority
_PRIORITY_ENV = {"RAY_worker_niceness": "0"}


@dataclass
class RayPlacement:
    """What the run says about where it ran."""
    kind: str            # "local" or "cluster"
    address: str         # GCS address
    cpus: int
    nodes: int
    temp_dir: str | None = None

    def describe(self) -> str:
        if self.kind == "local":
            return f"private local Ray at {self.address} (loopback only, {self.cpus} CPUs, temp {self.temp_dir})"
        return f"Ray cluster at {self.address}: {self.nodes} node(s), {self.cpus} CPUs"


def start_local(ray, workers: int | None) -> tuple[RayPlacement, Callable[[], None]]:
    """Start a private Ray; returns its placement and the cleanup to call after ray.shutdown()."""
    temp_dir = tempfile.mkdtemp(prefix="comet-ray-", dir="/tmp")   # short: Ray's socket paths must fit 107 B
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", *_LOOPBACK_ENV, *_PRIORITY_ENV)}
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16), **_LOOPBACK_ENV,
                       **_PRIORITY_ENV})
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")

    _refresh_auth()
    reaper = _start_reaper(temp_dir)

    def cleanup() -> None:
        if reaper is not None:   # Ray was shut down normally: the watchdog has nothing to do
            reaper.terminate()
            reaper.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _refresh_auth()
        shutil.rmtree(temp_dir, ignore_errors=True)

    from ray._private import ray_constants
    was = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False   # the same switch, when ray was imported before the env was set
    try:
        ray.init(address="local", num_cpus=workers or os.cpu_count(), include_dashboard=False,
                 logging_level="ERROR", log_to_driver=False, _node_ip_address="127.0.0.1", _temp_dir=temp_dir)
    except Exception:
        cleanup()
        raise
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = was
    return _placement(ray, "local", temp_dir), cleanup


HELPER_STOP_S = 0.5   # a helper still running after SIGTERM and this long is killed


def stop_helpers(ray) -> None:
    """Before ray.shutdown() of a private Ray: its helper processes (autoscaler monitor, dashboard, log
    monitor; none runs a task) signalled all at once. Ray stops its processes one after the other,
    giving each up to 1 s after SIGTERM, and its autoscaler monitor takes the whole second (measured:
    1.01 s of a 1.61 s shutdown; the dashboard 0.03 s, the log monitor 0.02 s). The raylet and the GCS
    are left to ray.shutdown(), in its order; a helper already stopped is skipped there. Reads Ray's
    private node table: with a Ray that lacks it, nothing is done here."""
    try:
        from ray._private import ray_constants, worker
        infos = worker._global_node.all_processes
        procs = [(kind, info.process) for kind in (ray_constants.PROCESS_TYPE_MONITOR,
                                                   ray_constants.PROCESS_TYPE_DASHBOARD,
                                                   ray_constants.PROCESS_TYPE_LOG_MONITOR)
                 for info in infos.get(kind, ())]
    except (ImportError, AttributeError):
        return
    import subprocess
    import time
    for kind, proc in procs:
        with contextlib.suppress(OSError):   # the monitor killed: on SIGTERM it reports its death to the driver
            proc.kill() if kind == ray_constants.PROCESS_TYPE_MONITOR else proc.terminate()
    deadline = time.monotonic() + HELPER_STOP_S
    for _, proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()


def _start_reaper(temp_dir: str):
    """The watchdog that kills this Ray's processes if this process dies without shutting it down."""
    import subprocess
    import sys
    try:
        return subprocess.Popen([sys.executable, "-m", "comet.search.ray_reaper", str(os.getpid()), temp_dir],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True,   # a Ctrl-C to the terminal's group leaves it to clean up
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])})
    except OSError:
        return None


def join(ray, address: str) -> RayPlacement:
    """Join the cluster at `address` (HOST:PORT, ray://HOST:PORT or auto) or fail with one line."""
    target = _resolve(address)
    host, port = _probe(target, address)
    _enable_token_auth_if_available()
    loopback_only = _is_loopback(host) and not _reachable(_host_ip(), port)
    from ray._private import ray_constants
    was = ray_constants.ENABLE_RAY_CLUSTER
    if loopback_only:   # a head bound to 127.0.0.1: keep Ray from swapping the address for the host's IP
        ray_constants.ENABLE_RAY_CLUSTER = False
    with _stderr_to_file() as log:
        try:
            ray.init(address=address if address.startswith("ray://") else target, include_dashboard=False,
                     logging_level="ERROR", log_to_driver=False,
                     **({"_node_ip_address": host} if loopback_only else {}))
        except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, AuthenticationError...
            raise ConfigError(_join_failure(target, exc, log.read_text(errors="replace")), field="--address") from None
        finally:
            ray_constants.ENABLE_RAY_CLUSTER = was
    return _placement(ray, "cluster")


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _host_ip() -> str:
    """The address Ray would advertise for this host (the interface of the default route)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))   # TEST-NET: no packet is sent, only the route is looked up
        return s.getsockname()[0]
    return "127.0.0.1"


def _reachable(host: str, port: int) -> bool:
    if _is_loopback(host):
        return True
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
        return True
    return False


def _placement(ray, kind: str, temp_dir: str | None = None) -> RayPlacement:
    res = ray.cluster_resources()
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    return RayPlacement(kind, ray.get_runtime_context().gcs_address, int(res.get("CPU", 0)), nodes, temp_dir)


def _resolve(address: str) -> str:
    """HOST:PORT of `address`; `auto` is RAY_ADDRESS or the cluster `ray start` recorded."""
    if address.startswith("ray://"):
        return address[len("ray://"):]
    if address != "auto":
        return address
    env = os.environ.get("RAY_ADDRESS")
    if env and env not in ("auto", "local"):
        return env
    recorded = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    if recorded.is_file() and recorded.read_text().strip():
        return recorded.read_text().strip()
    raise ConfigError("auto: no running Ray cluster found (no RAY_ADDRESS and nothing in "
                      f"{recorded}); start one with `ray start --head` or give HOST:PORT", field="--address")


def _probe(target: str, given: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"must be HOST:PORT, ray://HOST:PORT or auto, got {given!r}", field="--address")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        why = f"no answer within {PROBE_TIMEOUT_S:g} s" if isinstance(exc, socket.timeout) else \
            (exc.strerror or type(exc).__name__).lower()
        raise ConfigError(f"cannot reach a Ray cluster at {target} ({why}); is "
                          "`ray start --head` running there and the port open?", field="--address") from None
    return host.strip("[]"), int(port)


def _enable_token_auth_if_available() -> None:
    """Token auth when the user has not chosen a mode and a token is at hand (what `auto` does)."""
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or token_file.is_file():
        os.environ["RAY_AUTH_MODE"] = "token"
    _refresh_auth()


def _refresh_auth() -> None:
    """Ray caches its auth mode (C++ config) and token at first use: re-read them from the environment."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:   # an older Ray without token authentication
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def _stderr_to_file():
    """Ray's C++ client prints each connection retry to fd 2; keep them in a file for the error line."""
    with tempfile.NamedTemporaryFile(prefix="comet-ray-join-", suffix=".log", delete=False) as f:
        path = Path(f.name)
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.dup2(fd, 2)
    try:
        yield path
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
        path.unlink(missing_ok=True)


def _join_failure(target: str, exc: Exception, log: str) -> str:
    text = f"{exc} {log}"
    if "InvalidAuthToken" in text or "Unauthenticated" in text or "AuthenticationError" in type(exc).__name__:
        return (f"the Ray cluster at {target} rejected the authentication token: set RAY_AUTH_TOKEN (or "
                "RAY_AUTH_TOKEN_PATH) to the cluster's token (`ray get-auth-token` on its head node)")
    if "token" in text.lower() and "not found" in text.lower():
        return (f"the Ray cluster at {target} needs token authentication and no token was found: set "
                "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"cannot join the Ray cluster at {target}: {first[:300]}"
