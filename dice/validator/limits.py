"""Deadlines and memory caps for the compilers a check runs, which never run in the caller's process.

A model-written candidate can hold a macro that doubles at every expansion, or an ``#include`` that reads
without end: the compiler then runs at 100 % CPU with growing memory. So every compile runs in a child that
can be killed, under ``RLIMIT_AS`` (address space: allocation fails, the compiler stops with "out of
memory") and ``RLIMIT_CPU`` (a backstop should the child outlive the one waiting for it):

- NVRTC is a library, and a call into it cannot be interrupted: it runs in a child process of the caller
  (:class:`NvrtcProcess`, :mod:`dice.validator.nvrtc_child`), which serves the caller's compiles one at a
  time, dies with it (``PR_SET_PDEATHSIG``), and is killed at a compile's deadline (and started again for
  the next one).
- nvcc is a program that starts others (gcc, cudafe++, cicc, ptxas): :func:`run_command` starts it under
  ``sh -c 'ulimit -v ... -t ...; exec nvcc ...'`` (exact limits for the whole tree, no Python between fork
  and exec) in a process group of its own, and kills the group at the deadline (``subprocess.run``'s own
  timeout kills nvcc alone and leaves its compilers running).

Editor-sized deadlines: NVRTC takes 0.04 s (median) to 1.4 s (p90) on a fill, nvcc 2.4 s to 6.5 s, 12.6 s
for the heaviest TU of realproj (``benchmarks/results/realproj_compile.md``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

NVRTC_TIMEOUT_S = 10.0
NVCC_TIMEOUT_S = 30.0
MEMORY_ENV = "DICE_COMPILE_MEMORY_MB"
_GIB = 1 << 30
# Seconds of CPU time a compiler may use beyond its wall-clock deadline before the kernel stops it.
CPU_SLACK_S = 10


def compile_memory_bytes() -> int:
    """The address space one compiler process may use: ``$DICE_COMPILE_MEMORY_MB``, else a quarter of the
    machine's memory, at least 2 GiB and at most 8 GiB (NVRTC with CUB and nvcc's cicc on heavy templates
    stay well below 2 GiB of resident memory; the address space runs larger)."""
    env = os.environ.get(MEMORY_ENV, "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env) << 20
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        total = 8 * _GIB
    return max(2 * _GIB, min(8 * _GIB, total // 4))


@dataclass
class Outcome:
    """How a limited compile ended: ``ok`` (``value`` is the answer), ``timeout`` (killed at the
    deadline), ``crashed`` (the compiling process died or could not start: ``detail`` says how)."""

    status: Literal["ok", "timeout", "crashed"]
    value: Any = None
    seconds: float = 0.0
    detail: str = ""


_CHILD = str(Path(__file__).with_name("nvrtc_child.py"))
# Run the child by path with no folder of this package (nor the cwd) on sys.path: no package __init__
# runs, and no file beside it can shadow a module it imports.
_BOOT = "import sys; sys.path[:1] = []; import runpy; runpy.run_path(sys.argv[1], run_name='__main__')"
STARTUP_TIMEOUT_S = 120.0


_LIVE: weakref.WeakSet[NvrtcProcess] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Each NVRTC child's PCH folder goes with this process (after a kill: the system's /tmp cleanup)."""
    for proc in list(_LIVE):
        proc.close()


class NvrtcProcess:
    """This process's NVRTC child (:mod:`dice.validator.nvrtc_child`): started on first use (or by
    :meth:`start`), killed at a compile's deadline or when it dies, and started afresh for the next one.
    One compile at a time. A child process rather than a fork of the caller per compile: forking a
    process that has loaded libnvrtc costs ~25 ms (fork and exit), one with torch and 1 GiB in use
    ~120 ms."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None
        self._buffer = b""
        self._memory = 0
        self._owner = 0
        self._ready = False
        self._pch_dir: str | None = None  # the child's automatic-PCH folder (nvrtc_child), removed with it
        _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, memory_bytes: int | None = None) -> None:
        """Start the child now (it loads NVRTC while the caller does other things)."""
        with self._lock:
            self._ensure(compile_memory_bytes() if memory_bytes is None else memory_bytes)

    def compile(self, request: dict[str, Any], *, timeout_s: float, memory_bytes: int) -> Outcome:
        """Send one compile request (:mod:`dice.validator.nvrtc_child`) and wait at most ``timeout_s``
        for its answer (the child's start-up is not counted)."""
        with self._lock:
            self._ensure(memory_bytes)
            if not self._ready:
                hello = self._recv(STARTUP_TIMEOUT_S)
                if not isinstance(hello, dict) or not hello.get("ready"):
                    code = self._stop()
                    return Outcome(
                        "crashed", detail=f"{_exit_detail(code)} while starting (is CuPy installed?)"
                    )
                self._ready = True
            start = time.monotonic()
            line = json.dumps({**request, "cpu_s": math.ceil(timeout_s) + CPU_SLACK_S}) + "\n"
            try:
                assert self._proc is not None and self._proc.stdin is not None
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
                answer = self._recv(timeout_s)
            except OSError:
                answer = None
            seconds = time.monotonic() - start
            if isinstance(answer, dict):
                return Outcome("ok", answer, seconds)
            code = self._stop()
            if answer == "timeout":
                return Outcome("timeout", seconds=seconds, detail=f"killed after {timeout_s:g} s")
            return Outcome("crashed", seconds=seconds, detail=_exit_detail(code))

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _ensure(self, memory: int) -> None:
        if self._proc is not None and (
            self._owner != os.getpid() or self._proc.poll() is not None or self._memory != memory
        ):
            self._stop()
        if self._proc is not None:
            return
        read_fd, write_fd = os.pipe()
        # DICE_NVRTC_PCH=0 turns NVRTC's automatic PCH off (benchmarks/nvrtc_pch.py compares both)
        pch = os.environ.get("DICE_NVRTC_PCH", "1") != "0"
        self._pch_dir = tempfile.mkdtemp(prefix="dice-nvrtc-pch-") if pch else None
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _BOOT,
                    _CHILD,
                    str(write_fd),
                    str(memory),
                    str(os.getpid()),
                    self._pch_dir or "",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                pass_fds=(write_fd,),
            )
        except BaseException:
            os.close(read_fd)
            if self._pch_dir is not None:
                shutil.rmtree(self._pch_dir, ignore_errors=True)
            self._pch_dir = None
            raise
        finally:
            os.close(write_fd)
        self._fd, self._buffer, self._memory, self._owner = read_fd, b"", memory, os.getpid()
        self._ready = False

    def _recv(self, timeout: float) -> dict[str, Any] | str | None:
        """The next answer; "timeout" when none came in time, None when the child exited."""
        deadline = time.monotonic() + timeout
        assert self._fd is not None
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            ready, _, _ = select.select([self._fd], [], [], remaining)
            if not ready:
                return "timeout"
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def _stop(self) -> int | None:
        """Kill the child (if any; a forked copy of the owner leaves the owner's child alone) and forget
        it; its exit status."""
        proc, fd, mine = self._proc, self._fd, self._owner == os.getpid()
        self._proc, self._fd, self._ready = None, None, False
        code = None
        if proc is not None and mine:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
                code = proc.wait(timeout=10)
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._pch_dir is not None and mine:
            shutil.rmtree(self._pch_dir, ignore_errors=True)
        self._pch_dir = None
        return code


def _exit_detail(code: int | None) -> str:
    if code is None:
        return "the NVRTC process stopped answering"
    if code < 0:
        sig = -code
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        hint = " (over its CPU-time limit)" if sig == signal.SIGXCPU else ""
        return f"the NVRTC process was killed by {name}{hint}"
    return f"the NVRTC process exited with code {code}"


NVRTC = NvrtcProcess()  # this process's


@dataclass
class CommandResult:
    """A limited command's end: ``returncode`` None when it was killed at the deadline."""

    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


def limited_argv(cmd: Sequence[str], *, timeout_s: float, memory_bytes: int) -> list[str]:
    """``cmd`` behind ``sh -c 'ulimit ...; exec "$@"'``: the address-space (KiB) and CPU-time caps apply
    to it and to every process it starts; ``exec`` leaves no shell in between."""
    cpu = math.ceil(timeout_s) + CPU_SLACK_S
    script = f'ulimit -v {memory_bytes >> 10} && ulimit -t {cpu} && ulimit -c 0 && exec "$@"'
    return ["/bin/sh", "-c", script, "dice-compile", *cmd]


def run_command(
    cmd: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str],
    timeout_s: float,
    memory_bytes: int | None = None,
) -> CommandResult:
    """Run ``cmd`` (text output) under the limits, in a process group of its own that is killed whole
    at the deadline."""
    memory = compile_memory_bytes() if memory_bytes is None else memory_bytes
    argv = limited_argv(cmd, timeout_s=timeout_s, memory_bytes=memory)
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return CommandResult(proc.returncode, out, err, time.monotonic() - start)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a process that left the group still holds the pipes
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            proc.wait()
            out, err = "", ""
        return CommandResult(None, out or "", err or "", time.monotonic() - start)
    finally:
        if proc.poll() is None:  # an exception above (KeyboardInterrupt): leave nothing running
            _kill_group(proc.pid)
            proc.wait()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
