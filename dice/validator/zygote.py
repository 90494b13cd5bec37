"""The zygote: a process that has imported torch but never touched CUDA, and forks one runner per candidate.

Why: candidate code must not run in the judge (the worker that holds the reference, draws the seeds,
compares and times, and writes verdicts), and a runner must not be reused after candidate code ran in it
(nothing proves what such code left behind: patched functions, threads, a memo of outputs). A fresh
``python`` per candidate pays the torch import (~2-4 s) every time; a fork of this process pays ~10 ms,
and then the runner's own CUDA start. CUDA is never initialised here: a forked CUDA context is unusable.

``python -m dice.validator.zygote CONTROL_FD``: the judge (:class:`Zygote`) talks over a ``SOCK_SEQPACKET``
socket: one JSON request per message, ``{"op": "spawn", "mode": ..., "args": {...}}`` with the runner's end
of a fresh socket attached (``SCM_RIGHTS``), answered ``{"pid": N}``; ``{"op": "wait", "pid": N,
"timeout": s}`` answered ``{"pid": N, "exited": bool, "code": int | None, "signal": int | None}``. The
zygote is not dumpable (``PR_SET_DUMPABLE`` 0: no same-user ``ptrace`` or ``/proc/<pid>/mem`` write, so a
runner cannot plant code in the zygote its successors are forked from), dies with the judge, and its
stdout/stderr are the worker's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from typing import Any

from dice.validator.zygote_client import MAX_MESSAGE, not_dumpable


def _fork_is_clean() -> bool:
    """Whether a child forked now can start CUDA: torch marks forks "bad" once this process asked CUDA
    anything (``torch.cuda.is_available()`` does, in ``torch.utils.cpp_extension``'s import, unless
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, which the judge sets for the zygote)."""
    pid = os.fork()
    if pid == 0:
        import torch

        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _preload() -> None:
    """What every runner needs, imported once here (no CUDA call)."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - 4.7-6.2 s of every runner's start on the H200 when left to it
    import torch.nn.functional  # noqa: F401
    import torch.profiler  # noqa: F401
    import torch.utils.cpp_extension  # noqa: F401

    with contextlib.suppress(ImportError):
        import cupy  # noqa: F401

    from dice.validator import builds, cu_runner, fastbuild, kbsetup, runner  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    from dice.validator.lifeline import die_with_parent

    argv = sys.argv[1:] if argv is None else argv
    owner = os.environ.get("DICE_ZYGOTE_OWNER", "")
    die_with_parent(int(owner) if owner.isdigit() else None)
    not_dumpable()
    control = socket.socket(fileno=int(argv[0]))
    try:
        _preload()
        if not _fork_is_clean():
            raise RuntimeError("CUDA was asked something in the zygote: its runners could not start CUDA")
    except Exception as exc:  # noqa: BLE001 - told to the judge, which reports it in the verdict
        control.send(json.dumps({"event": "fatal", "message": f"{type(exc).__name__}: {exc}"}).encode())
        return 1
    control.send(json.dumps({"event": "ready", "pid": os.getpid()}).encode())
    exited: dict[int, int] = {}
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(control, MAX_MESSAGE, 4)
        except OSError:
            return 0
        if not data:
            return 0  # the judge closed its end
        _reap(exited)
        request = json.loads(data)
        if request.get("op") == "spawn":
            reply = _spawn(control, request, fds)
        elif request.get("op") == "wait":
            reply = _wait(int(request["pid"]), float(request.get("timeout", 0)), exited)
        else:
            reply = {"error": f"unknown op {request.get('op')!r}"}
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        control.send(json.dumps(reply).encode())


def _spawn(control: socket.socket, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    if len(fds) != 1:
        return {"error": "spawn needs exactly one socket"}
    pid = os.fork()
    if pid == 0:  # the runner
        code = 1
        try:
            control.close()
            os.setpgid(0, 0)  # its own group: the judge kills it and whatever it started, together
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            from dice.validator.lifeline import die_with_parent

            die_with_parent(None)
            not_dumpable(True)  # CUDA does not start otherwise (see not_dumpable)
            if request.get("role") == "builder":
                from dice.validator.builder import serve
            elif request.get("mode") == "cu":
                from dice.validator.cu_runner import serve
            else:
                from dice.validator.runner import serve

            code = serve(fds[0], str(request.get("mode", "")), request.get("args") or {})
        except BaseException:  # noqa: BLE001 - a runner never returns into the zygote's loop
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return {"pid": pid}


def _reap(exited: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exited[pid] = status


def _wait(pid: int, timeout: float, exited: dict[int, int]) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while pid not in exited:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return {"pid": pid, "exited": True, "code": None, "signal": None}
        if got == pid:
            exited[pid] = status
            break
        if time.monotonic() >= deadline:
            return {"pid": pid, "exited": False, "code": None, "signal": None}
        time.sleep(0.01)
    status = exited.pop(pid)
    return {
        "pid": pid,
        "exited": True,
        "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
    }


if __name__ == "__main__":
    sys.exit(main())
