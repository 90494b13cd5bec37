"""Workers do not outlive their owner: a SIGKILLed pool's worker (blocked in a task, or waiting on its
NVRTC child) exits within seconds, as does one whose owner closed the result pipe; the folders such owners
leave behind are removed when the next pool starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dice.validator import ValidatorPool
from dice.validator.lifeline import OWNER_FILE, OWNER_GONE_EXIT, start_time, write_owner

ROOT = Path(__file__).resolve().parents[2]
BOMB = (
    "#define A(x) x x\n#define B(x) A(A(A(A(x))))\n#define C(x) B(B(B(B(x))))\n"
    "#define D(x) C(C(C(C(x))))\n__global__ void k(float* p) { D(p[0] += 1.0f;) }\n"
)

# A pool in its own process: one worker busy with the task in argv[1] ("sleep": a probe blocked for an
# hour; "bomb": NVRTC expanding a macro bomb under a one-hour deadline). Prints the worker's pid and folder.
OWNER = textwrap.dedent(
    """
    import json, sys, time
    from dice.validator import ValidatorPool

    pool = ValidatorPool(1, gpu=False, build_timeout_s=3600, nvrtc_timeout_s=3600)
    if sys.argv[1] == "sleep":
        pool._submit({"kind": "probe", "action": "sleep", "seconds": 3600, "phase": "build"}, use_cache=False)
    else:
        pool.submit_cu(sys.argv[2])
    while pool._live[0] is None:
        time.sleep(0.05)
    worker = pool._live[0]
    print(json.dumps({"pid": worker.pid, "folder": str(worker.workdir)}), flush=True)
    time.sleep(3600)
    """
)


def gone(pid: int, within: float) -> bool:
    """Whether ``pid`` is dead (a zombie nobody reaped counts as dead) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if start_time(pid) is None:
            return True
        time.sleep(0.05)
    return start_time(pid) is None


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
                out.append(int(entry))
    return out


@pytest.fixture()
def tmpdir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private temporary folder (worker folders land there) and build cache, for pools in this process
    and in the owner processes the tests start."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    yield temp


def start_owner(task: str, *extra: str) -> tuple[subprocess.Popen[str], dict]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, task, *extra], stdout=subprocess.PIPE, text=True, env=env
    )
    assert owner.stdout is not None
    line = owner.stdout.readline()
    if not line:
        owner.kill()
        pytest.fail("the owner process did not start its worker")
    return owner, json.loads(line)


def kill_owner(owner: subprocess.Popen[str]) -> None:
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)


def test_a_blocked_worker_dies_with_its_sigkilled_owner_and_its_folder_is_cleaned_at_next_start(
    tmpdir_env: Path,
) -> None:
    owner, worker = start_owner("sleep")
    try:
        time.sleep(1.5)  # the worker has taken the task and sleeps in it, not reading its stdin
        assert start_time(worker["pid"]) is not None
        record = json.loads((Path(worker["folder"]) / OWNER_FILE).read_text())
        assert record["owner_pid"] == owner.pid and record["worker_pid"] == worker["pid"]
        kill_owner(owner)
        assert gone(worker["pid"], within=5), "the worker outlived its SIGKILLed owner"
    finally:
        if owner.poll() is None:
            kill_owner(owner)
        if start_time(worker["pid"]) is not None:
            os.kill(worker["pid"], signal.SIGKILL)
    folder = Path(worker["folder"])
    assert folder.is_dir()  # nobody was left to remove it
    with ValidatorPool(1, gpu=False) as pool:
        assert folder in pool.removed_stale
    assert not folder.exists()


def test_a_worker_compiling_a_bomb_dies_with_its_owner_and_so_does_its_nvrtc_child(tmpdir_env: Path) -> None:
    owner, worker = start_owner("bomb", BOMB)
    compiler: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not compiler and time.monotonic() < deadline:  # the NVRTC child, once it compiles
            compiler = [c for c in children(worker["pid"]) if start_time(c) is not None]
            time.sleep(0.1)
        assert compiler, "the worker started no NVRTC process"
        time.sleep(1.0)  # the bomb is expanding
        kill_owner(owner)
        assert gone(worker["pid"], within=5), "the worker outlived its SIGKILLed owner"
        assert gone(compiler[0], within=5), "the NVRTC process outlived its worker"
    finally:
        if owner.poll() is None:
            kill_owner(owner)
        for pid in [worker["pid"], *compiler]:
            if start_time(pid) is not None:
                os.kill(pid, signal.SIGKILL)


def test_a_worker_exits_when_its_owner_closes_the_result_pipe(tmpdir_env: Path, tmp_path: Path) -> None:
    """The watchdog: here the owner (this test) lives on, so only the closed pipe tells the worker."""
    folder = tmp_path / "worker"
    folder.mkdir()
    read_fd, write_fd = os.pipe()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DICE_WORKER_CACHE": str(tmp_path / "cache"),
        "DICE_WORKER_LOG": str(folder / "worker.log"),
        "DICE_WORKER_GPU": "0",
        "DICE_WORKER_OWNER": str(os.getpid()),
        "CUDA_VISIBLE_DEVICES": "",
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "dice.validator.worker", str(write_fd)],
        stdin=subprocess.PIPE,
        cwd=folder,
        env=env,
        pass_fds=(write_fd,),
        start_new_session=True,
    )
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as events:
            assert json.loads(events.readline())["event"] == "ready"
            assert worker.stdin is not None
            task = {"kind": "probe", "action": "sleep", "seconds": 3600, "phase": "build", "id": 1}
            worker.stdin.write((json.dumps(task) + "\n").encode())
            worker.stdin.flush()
            assert json.loads(events.readline())["phase"] == "build"  # it sleeps in the task now
        assert worker.wait(timeout=5) == OWNER_GONE_EXIT  # ended by the watchdog, long before the hour
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_only_folders_of_owners_that_are_gone_are_removed(tmpdir_env: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmpdir_env / "dice-worker-stale"
    stale.mkdir()
    (stale / OWNER_FILE).write_text(json.dumps({"owner_pid": dead.pid, "owner_start": 1}))
    reused = tmpdir_env / "dice-worker-reused-pid"  # this pid runs, but it is not the process recorded
    reused.mkdir()
    (reused / OWNER_FILE).write_text(json.dumps({"owner_pid": os.getpid(), "owner_start": 1}))
    live = tmpdir_env / "dice-worker-live"
    live.mkdir()
    write_owner(live)  # this process
    unknown = tmpdir_env / "dice-worker-unknown"  # no record: being created, or from an older version
    unknown.mkdir()
    other = tmpdir_env / "not-a-worker"
    other.mkdir()
    (other / OWNER_FILE).write_text(json.dumps({"owner_pid": dead.pid}))
    with ValidatorPool(1, gpu=False) as pool:
        assert sorted(pool.removed_stale) == sorted([stale, reused])
    assert live.is_dir() and unknown.is_dir() and other.is_dir()
    assert not stale.exists() and not reused.exists()
