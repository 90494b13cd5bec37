"""The machine-wide GPU lock (dice.validator.context.WorkerContext.acquire_gpu): a POSIX lock that a daemon
forked by candidate code does not inherit, and a deadline on the wait (GpuBusy, a ``timeout`` verdict)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dice.validator.context import GpuBusy, WorkerContext

# A worker that takes the lock, forks a setsid daemon (as candidate code could) that sleeps for a minute,
# then exits: the lock must go with the worker, not stay with the daemon.
HOLDER = textwrap.dedent(
    """
    import io, os, sys, time
    from dice.validator.context import WorkerContext
    ctx = WorkerContext(io.StringIO())
    ctx.acquire_gpu()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            # write then rename, so that the test never reads a created but still empty file
            with open(sys.argv[1] + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(sys.argv[1] + ".tmp", sys.argv[1])
            time.sleep(60)
        os._exit(0)
    time.sleep(float(sys.argv[2]))
    """
)


@pytest.fixture
def lock_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("DICE_WORKER_GPU", raising=False)
    monkeypatch.setenv("DICE_WORKER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DICE_WORKER_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("DICE_GPU_LOCK", str(tmp_path / "gpu0.lock"))
    return tmp_path


def _holder(tmp_path: Path, hold_s: float) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2]), *sys.path]))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "daemon.pid"), str(hold_s)], env=env
    )
    deadline = time.monotonic() + 30
    while not (tmp_path / "daemon.pid").exists():  # the holder has the lock once its daemon runs
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    return proc


def test_a_daemon_forked_by_the_holder_does_not_keep_the_lock(lock_env: Path, monkeypatch) -> None:
    proc = _holder(lock_env, 0.5)
    daemon = int((lock_env / "daemon.pid").read_text())
    try:
        monkeypatch.setenv("DICE_GPU_LOCK_WAIT_S", "20")
        ctx = WorkerContext(io.StringIO())
        started = time.monotonic()
        ctx.acquire_gpu()  # with flock the daemon held it: GpuBusy after 20 s
        assert time.monotonic() - started < 15
        assert proc.wait(timeout=10) == 0
        os.kill(daemon, 0)  # the daemon is still alive, and the lock is ours anyway
        ctx.release_gpu()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, 9)
        proc.kill()


def test_waiting_has_a_deadline_and_names_the_holder(lock_env: Path, monkeypatch) -> None:
    proc = _holder(lock_env, 30)
    daemon = int((lock_env / "daemon.pid").read_text())
    try:
        monkeypatch.setenv("DICE_GPU_LOCK_WAIT_S", "0.5")
        ctx = WorkerContext(io.StringIO())
        started = time.monotonic()
        with pytest.raises(GpuBusy) as err:
            ctx.acquire_gpu()
        assert 0.4 < time.monotonic() - started < 10
        assert f"held by pid {proc.pid}" in str(err.value) and "0.5 s" in str(err.value)
        assert ctx._lock_fd is None
    finally:
        os.kill(daemon, 9)
        proc.kill()
        proc.wait()
    # once the holder is gone the lock is free again at once
    ctx.acquire_gpu()
    ctx.release_gpu()
