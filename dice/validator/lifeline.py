"""Processes and folders that must not outlive their owner.

- :func:`die_with_parent`: the kernel's ``PR_SET_PDEATHSIG`` (through ctypes: the standard library has no
  binding for ``prctl``): SIGKILL when the parent goes, even while blocked in C (NVRTC, ``flock``, a sleep).
  It follows the parent *thread* that started the process; the pool starts its workers from its slot
  threads, which live as long as the pool.
- :func:`watch_owner`: a thread that waits for the owner's end of a pipe to close (``POLLERR``/``POLLHUP``:
  the owner exited, however it died) and then kills this process's whole session. It covers what
  ``PR_SET_PDEATHSIG`` cannot: a non-Linux kernel, a parent that was not the owner.
- :func:`kill_session`: every process of a session (a worker and what it started in process groups of
  their own, such as nvcc's compilers), found through ``/proc``.
- Owner records: a worker folder says which process made it (pid and start time, which tell a reused pid
  apart) and which worker used it; :func:`remove_stale_folders` removes those whose owner is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import sys
import threading
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
OWNER_FILE = "owner.json"
ORPHANED_EXIT = 70  # a worker whose owner was gone before it could ask to die with it
OWNER_GONE_EXIT = 71  # a worker that the watchdog ended: its owner closed the pipe
WORKER_PREFIX = "dice-worker-"


def die_with_parent(expected_parent: int | None = None) -> bool:
    """Ask the kernel for SIGKILL when the parent exits; False where that is not available (not Linux).

    With ``expected_parent``, exits at once when the parent is already another process: the owner died
    before the request was made, and nothing would ever send the signal."""
    armed = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(ORPHANED_EXIT)
    return armed


def kill_session(sid: int, *, spare: int | None = None, not_before: int | None = None) -> int:
    """SIGKILL every process whose session id is ``sid`` (but ``spare``); returns how many were signalled.

    ``not_before``: the session leader's start time. Then a leader that is another process now (its pid
    reused) means the session is not the one meant: nothing is killed; and processes started before it
    are spared. Only processes this user may signal are affected; one that exits meanwhile is skipped."""
    if not_before is not None:
        leader = start_time(sid)
        if leader is not None and leader != not_before:
            return 0
    count = 0
    for pid in _pids():
        if pid == spare:
            continue
        if _stat_field(pid, 3) != sid:  # field 6 of /proc/PID/stat: the session id
            continue
        if not_before is not None and (start_time(pid) or 0) < not_before:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            count += 1
    return count


def watch_owner(fd: int) -> threading.Thread:
    """Start a daemon thread that ends this process when the reader of pipe ``fd`` (a write end whose read
    end the owner holds) closes it, i.e. when the owner is gone; a session leader (a worker) takes its
    whole session along (its compilers)."""

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, 0)  # no events asked: POLLERR/POLLHUP/POLLNVAL are always reported
        while True:
            try:
                events = poller.poll()
            except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for safety
                continue
            if any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, ev in events):
                break
        me = os.getpid()
        if os.getsid(0) == me:  # only a session leader's session is its own (a worker's is)
            with contextlib.suppress(OSError):
                kill_session(me, spare=me)
        os._exit(OWNER_GONE_EXIT)

    thread = threading.Thread(target=watch, name="dice-owner-watch", daemon=True)
    thread.start()
    return thread


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), None when it does not exist or is a
    zombie (dead, not yet reaped)."""
    state = _stat_field(pid, 0, raw=True)
    if state is None or state in ("Z", "X"):
        return None
    return _stat_field(pid, 19)  # field 22 of /proc/PID/stat


def alive(pid: int, started: int | None) -> bool:
    """Whether ``pid`` is the process that started at ``started`` (not a later one given the same pid)."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def write_owner(folder: Path, *, worker: int | None = None) -> None:
    """Record this process as the owner of ``folder`` (and ``worker`` as the process working in it)."""
    me = os.getpid()
    record: dict[str, int | None] = {"owner_pid": me, "owner_start": start_time(me)}
    if worker is not None:
        record.update({"worker_pid": worker, "worker_start": start_time(worker)})
    tmp = folder / f".{OWNER_FILE}.tmp"
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, folder / OWNER_FILE)


def remove_stale_folders(root: Path, prefix: str = WORKER_PREFIX) -> list[Path]:
    """Remove the folders ``root/prefix*`` of this user whose recorded owner no longer runs, after killing
    a worker of theirs that still does (a worker from before workers died with their owner). Folders
    without a record (being created, or made by an older version) are left alone. Returns those removed."""
    removed: list[Path] = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return removed
    for folder in candidates:
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            record = json.loads((folder / OWNER_FILE).read_text(encoding="utf-8"))
            owner, owner_start = int(record["owner_pid"]), record.get("owner_start")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if alive(owner, owner_start):
            continue
        worker = record.get("worker_pid")
        if isinstance(worker, int) and alive(worker, record.get("worker_start")) and _is_worker(worker):
            with contextlib.suppress(OSError):
                if os.getsid(worker) == worker:  # the pool starts each worker as a session leader
                    kill_session(worker, not_before=record.get("worker_start"))
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed.append(folder)
    return removed


def _is_worker(pid: int) -> bool:
    try:
        return b"dice.validator.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _stat_field(pid: int, index: int, *, raw: bool = False):  # noqa: ANN202 - int, or str with raw
    """Field ``index`` (0 = state, the third field) of /proc/PID/stat, read after the command name's
    closing parenthesis (the name itself may hold spaces and parentheses); None when unreadable."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = data[data.rfind(")") + 2 :].split()
    if index >= len(fields):
        return None
    if raw:
        return fields[index]
    try:
        return int(fields[index])
    except ValueError:
        return None
