"""The judge's side of the zygote (:mod:`dice.validator.zygote`): start it, ask it for runners, wait for
their exit. Apart from the zygote's own module, which imports the runner, so that nothing the judge imports
leads to candidate-side code."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PR_SET_DUMPABLE = 4
MAX_MESSAGE = 1 << 20
START_TIMEOUT_S = 180.0


def not_dumpable(dumpable: bool = False) -> None:
    """``prctl(PR_SET_DUMPABLE, 0)``: processes of the same user can no longer ptrace this one or write
    its memory through ``/proc`` (and forks inherit it). CUDA cannot start in such a process
    (``cudaGetDeviceCount``: error 304, seen on the H200): the worker calls this after its CUDA start, a
    runner sets itself dumpable again before its own (its Landlock layer keeps it from reaching out)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, int(dumpable), 0, 0, 0)


class ZygoteError(RuntimeError):
    """The zygote did not start or stopped answering."""


class Zygote:
    """Judge side: starts the zygote (lazily, again after it died) and asks it for runners."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._ready = False
        self._started_at = 0.0
        self.started_s: float | None = None

    def start(self) -> None:
        """Start the zygote process without waiting for it (a worker does this while it waits for its first
        task: the zygote's imports take seconds); the first request waits for its ``ready``."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self.close()
        self._started_at = time.perf_counter()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # NVML for torch.cuda.is_available(): the runtime's cudaGetDeviceCount would mark every fork bad
        env = dict(os.environ, DICE_ZYGOTE_OWNER=str(os.getpid()), PYTORCH_NVML_BASED_CUDA_CHECK="1")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "dice.validator.zygote", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(Path.cwd()),
            )
        finally:
            theirs.close()
        self._control = mine
        self._ready = False

    def _ensure(self) -> socket.socket:
        if self._control is not None and self._proc is not None and self._proc.poll() is None and self._ready:
            return self._control
        self.start()
        reply = self._receive(START_TIMEOUT_S)
        if reply.get("event") != "ready":
            self.close()
            raise ZygoteError(f"the runner zygote failed to start: {reply.get('message', reply)}")
        self.started_s = time.perf_counter() - self._started_at
        self._ready = True
        assert self._control is not None
        return self._control

    def _receive(self, timeout: float) -> dict[str, Any]:
        assert self._control is not None
        self._control.settimeout(timeout)
        try:
            data = self._control.recv(MAX_MESSAGE)
        except (OSError, TimeoutError) as exc:
            self.close()
            raise ZygoteError(f"the runner zygote stopped answering ({exc})") from None
        if not data:
            self.close()
            raise ZygoteError("the runner zygote exited")
        return json.loads(data)

    def spawn(self, mode: str, args: dict[str, Any], role: str = "runner") -> tuple[int, socket.socket]:
        """A new runner (or ``role="builder"``: a builder) in ``mode`` with ``args``: (its pid, the judge's
        end of its socket)."""
        control = self._ensure()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(
                control,
                [json.dumps({"op": "spawn", "role": role, "mode": mode, "args": args}).encode()],
                [theirs.fileno()],
            )
        except OSError as exc:
            mine.close()
            self.close()
            raise ZygoteError(f"the runner zygote stopped answering ({exc})") from None
        finally:
            theirs.close()
        reply = self._receive(30.0)
        if "pid" not in reply:
            mine.close()
            raise ZygoteError(f"the runner zygote refused: {reply.get('error', reply)}")
        return int(reply["pid"]), mine

    def wait(self, pid: int, timeout: float = 0.0) -> dict[str, Any]:
        """The runner's exit (``exited``, ``code``, ``signal``), waiting at most ``timeout`` seconds."""
        control = self._ensure()
        control.send(json.dumps({"op": "wait", "pid": pid, "timeout": timeout}).encode())
        return self._receive(timeout + 30.0)

    def close(self) -> None:
        self._ready = False
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None
