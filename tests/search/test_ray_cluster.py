"""Ray where users run it: join a real `ray start` head (token auth) by address and by `auto`, fail fast on
an unreachable address, keep the default local Ray private, and leave no Ray process behind a killed
search. The head is started on loopback on a free port with its own temp dir and stopped by its pid."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from comet.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "search_spaces" / "tiny.yaml"
FLAGSHIP = ROOT / "search_spaces" / "gpt3_1t.yaml"
RAY_CLI = Path(sys.executable).parent / "ray"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _comet(args: list[str], env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "comet", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)}, timeout=timeout)


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """`ray start --head --block` on 127.0.0.1:<free port>, token auth with a token of its own."""
    pytest.importorskip("ray")
    if not RAY_CLI.exists():
        pytest.skip(f"no `ray` command beside {sys.executable}")
    port, token = _free_port(), secrets.token_hex(16)
    temp = Path(f"/tmp/comet-test-ray-{secrets.token_hex(3)}")    # Ray's socket paths must stay short
    env = {**_clean_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}              # bind to loopback (see ray_runtime.py)
    log = tmp_path_factory.mktemp("ray_head") / "head.log"
    with log.open("w") as out:
        head = subprocess.Popen([str(RAY_CLI), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
                                 "--include-dashboard=false", "--node-ip-address=127.0.0.1", f"--temp-dir={temp}"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if head.poll() is not None:
                pytest.skip(f"`ray start --head` exited with {head.returncode}: {log.read_text()[-500:]}")
            if "Ray runtime started" in log.read_text():
                break
            time.sleep(0.5)
        else:
            pytest.skip(f"`ray start --head` not up within 120 s: {log.read_text()[-500:]}")
        yield {"address": f"127.0.0.1:{port}", "token": token, "pid": head.pid}
    finally:
        head.send_signal(signal.SIGTERM)     # stopped by its own pid; --block takes its daemons down with it
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_search_joins_token_auth_cluster_by_address(ray_head, tmp_path):
    env = {**_clean_env(), "RAY_AUTH_TOKEN": ray_head["token"]}    # no RAY_AUTH_MODE: comet turns it on
    run = _comet(["search", str(TINY), "--address", ray_head["address"], "--out", str(tmp_path),
                  "--no-timelines"], env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"running on Ray cluster at {ray_head['address']}: 1 node(s), 2 CPUs" in run.stdout
    assert "InvalidAuthToken" not in run.stdout + run.stderr
    df = pd.read_parquet(tmp_path / "candidates.parquet")
    assert len(df) == 22 and (df["status"] == "ok").all()
    assert f"Ray cluster at {ray_head['address']}" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"   # drawn by the cluster's workers


def test_search_joins_by_auto(ray_head, tmp_path):
    env = {**_clean_env(), "RAY_AUTH_TOKEN": ray_head["token"], "RAY_ADDRESS": ray_head["address"]}
    run = _comet(["search", str(TINY), "--address", "auto", "--out", str(tmp_path), "--no-timelines"], env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"running on Ray cluster at {ray_head['address']}" in run.stdout


def test_wrong_token_is_one_line(ray_head, tmp_path):
    env = {**_clean_env(), "RAY_AUTH_TOKEN": "0" * 32}
    run = _comet(["search", str(TINY), "--address", ray_head["address"], "--out", str(tmp_path)], env)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "rejected the authentication token" in run.stderr, run.stderr[-2000:]


def test_default_local_ray_is_private(ray_head, tmp_path, monkeypatch):
    """With a `ray start` cluster on the machine and RAY_ADDRESS pointing at it, the default run still
    starts its own Ray, on loopback, and removes its temp dir afterwards."""
    ray = pytest.importorskip("ray")
    psutil = pytest.importorskip("psutil")
    from comet.config.cluster import load_cluster
    from comet.config.job import JobSpec
    from comet.config.model import load_model
    from comet.search.context import EvalContext
    from comet.search.executor import RayExecutor

    if ray.is_initialized():
        pytest.skip("a Ray session is already open in this process")
    monkeypatch.setenv("RAY_ADDRESS", ray_head["address"])
    ex = RayExecutor(EvalContext(load_model("gpt_1_7b"), load_cluster("h100_dgx"), JobSpec()), workers=1)
    try:
        assert ex.where.startswith("private local Ray at 127.0.0.1:") and ray_head["address"] not in ex.where
        temp = ex.where.split("temp ")[1].rstrip(")")
        assert Path(temp).is_dir()
        started = [p for p in psutil.Process().children(recursive=True) if temp in " ".join(p.cmdline())]
        assert len(started) >= 3       # GCS, raylet, helpers (ray_runtime.stop_helpers stops some first)
    finally:
        ex.close()
    assert not Path(temp).exists()
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_unreachable_address_fails_in_seconds(capsys):
    t0 = time.monotonic()
    assert main(["search", str(TINY), "--address", f"127.0.0.1:{_free_port()}"]) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - t0 < 15
    assert err.count("\n") == 1 and "cannot reach a Ray cluster at 127.0.0.1:" in err and "refused" in err


def test_killed_search_leaves_no_ray_process(tmp_path):
    """SIGKILL of the search: its Ray (GCS, raylet, agents, workers) is gone within seconds."""
    pytest.importorskip("ray")
    psutil = pytest.importorskip("psutil")
    proc = subprocess.Popen([sys.executable, "-m", "comet", "search", str(FLAGSHIP), "--workers", "1",
                             "--out", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**_clean_env(), "PYTHONPATH": str(ROOT)})
    try:
        for line in proc.stdout:
            if "candidates to evaluate" in line:
                break
        else:
            pytest.fail("the search ended before evaluating")
        # Ray's processes may still be forking on a loaded machine: wait until the raylet is there
        deadline = time.monotonic() + 60
        family = []
        while proc.poll() is None and time.monotonic() < deadline:
            family = psutil.Process(proc.pid).children(recursive=True)
            if any("raylet" in p.name() for p in family):
                break
            time.sleep(0.2)
        assert any("raylet" in p.name() for p in family)
        time.sleep(1)
        family = psutil.Process(proc.pid).children(recursive=True)
    finally:
        proc.kill()
        proc.wait()
    gone, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, [p.name() for p in alive]
