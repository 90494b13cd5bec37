"""The worker process: ``python -m dice.validator.worker RESULT_FD``.

It reads one JSON task per line on stdin and writes JSON events to the inherited file descriptor
RESULT_FD (stdout and stderr go to a log file, so candidate output can never corrupt the protocol):
``{"event": "ready"}`` once, then per task any number of
``{"event": "phase", "phase": "build"|"wait_gpu"|"run"}`` and one
``{"event": "result", "verdict": {...}, "restart": bool}``. The pool applies its deadlines per phase and
kills the whole process group when one passes.

What a task receives (:class:`WorkerContext`) lives in :mod:`dice.validator.context`, so the task modules
never import this one.

A worker dies with its owner, even while blocked in a task (a compile, the GPU lock, a sleeping probe):
``PR_SET_PDEATHSIG`` (SIGKILL when the pool's process goes; ``DICE_WORKER_OWNER`` says which process that
must be, in case it went before the request was made) and a watchdog thread on RESULT_FD, whose read end
only the owner holds: when it closes, the worker kills its session (its compilers too) and exits
(:mod:`dice.validator.lifeline`).

Before anything else it confines itself as the pool started it (:func:`dice.validator.sandbox.confine_self`:
rlimits; Landlock in the fallback) and says which isolation is in force in its ``ready`` event
(``"isolation"``); a fallback it cannot apply is a ``fatal`` event, and the pool gives up on the slot.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from dice.validator.context import GpuBusy, WorkerContext
from dice.validator.lifeline import die_with_parent, watch_owner
from dice.validator.limits import NVRTC
from dice.validator.sandbox import confine_self
from dice.validator.spec_files import dependency_file_stamps
from dice.validator.verdict import Verdict, error_verdict
from dice.validator.zygote_client import not_dumpable


def _run_task(ctx: WorkerContext, task: dict[str, Any]) -> tuple[Verdict, bool]:
    kind = task.get("kind")
    if kind == "cu":
        from dice.validator.cu import run_cu

        return run_cu(ctx, task)
    if kind == "kernelbench":
        from dice.validator.kernelbench import run_kernelbench

        return run_kernelbench(ctx, task)
    if kind == "kb_prebuild":
        from dice.validator.batchbuild import run_prebuild

        return run_prebuild(ctx, task)  # discovery imports candidates: in a runner, not here
    if kind == "probe":
        return _probe(ctx, task)
    return error_verdict("runtime_error", f"unknown task kind {kind!r}"), False


def _probe(ctx: WorkerContext, task: dict[str, Any]) -> tuple[Verdict, bool]:
    """Pool self-test task (tests and ``dice validate --check``): misbehave on purpose in a chosen phase."""
    action = task.get("action", "ok")
    ctx.phase(task.get("phase", "run"))
    if action == "sleep":
        time.sleep(float(task.get("seconds", 3600)))
    elif action == "segfault":
        import ctypes

        ctypes.string_at(0)
    elif action == "exit":
        os._exit(3)
    elif action == "raise":
        raise RuntimeError("probe failure")
    elif action == "write_cwd":
        Path("probe.txt").write_text("x")
    elif action == "exec":  # tests of the sandbox: what candidate code can do here
        scope: dict[str, Any] = {}
        exec(str(task.get("code", "")), scope)  # noqa: S102 - test-provided code, like any candidate's
        return Verdict("compiled", True, message=json.dumps(scope.get("result"))), False
    info = {
        "pid": task.get("worker_pid") or os.getpid(),  # under bwrap, the pid outside its pid namespace
        "cwd": str(Path.cwd()),
        "gpu": ctx.gpu,
        "home": os.environ.get("HOME"),
        "tmp": os.environ.get("TMPDIR"),
    }
    return Verdict("compiled", True, message=json.dumps(info)), False


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_log_from(path: Path, offset: int, limit: int = 8000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(offset, _log_size(path) - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    owner = os.environ.get("DICE_WORKER_OWNER", "")
    die_with_parent(int(owner) if owner.isdigit() else None)
    watch_owner(int(argv[0]))
    out = os.fdopen(int(argv[0]), "w", buffering=1)
    faulthandler.enable(all_threads=True)
    try:
        isolation = confine_self()  # before any task (and before torch, CUDA, NVRTC start)
        ctx = WorkerContext(out)  # CUDA starts here in a GPU worker, before the process turns undumpable
        not_dumpable()  # no same-user ptrace or /proc/<pid>/mem: a runner cannot reach into the judge
    except Exception as exc:  # noqa: BLE001 - reported to the pool, which gives up on this slot
        out.write(json.dumps({"event": "fatal", "message": f"{type(exc).__name__}: {exc}"}) + "\n")
        out.flush()
        return 1
    ctx.send(
        {
            "event": "ready",
            "pid": os.getpid(),
            "gpu": ctx.gpu,
            "device": ctx.device_name,
            "arch": ctx.arch,
            "isolation": isolation,
        }
    )
    print(f"dice worker: isolation: {isolation}", flush=True)  # the worker log
    with contextlib.suppress(OSError):
        NVRTC.start()  # loads NVRTC in its own process while this one waits for the first task
    if ctx.gpu or ctx.emulated:
        with contextlib.suppress(OSError):
            ctx.zygote.start()  # its imports (torch, torch._dynamo: ~5 s) likewise, before the first run
    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        ctx.task_id = task.get("id")
        ctx.task_deps = []
        ctx.set_limits(task.get("limits"))
        log_start = _log_size(ctx.log_path)
        restart = False
        try:
            verdict, restart = _run_task(ctx, task)
        except GpuBusy as exc:  # another task (or what a candidate left behind) held the GPU too long
            verdict = error_verdict("timeout", f"not run: {exc}", "")
        except Exception as exc:  # noqa: BLE001 - any failure of a task becomes its verdict
            verdict = error_verdict(
                "runtime_error", f"validator error: {type(exc).__name__}: {exc}", traceback.format_exc()
            )
            restart = True
        finally:
            ctx.release_gpu()
        output = _read_log_from(ctx.log_path, log_start).strip()
        if output:
            verdict.log = (verdict.log + "\n--- worker output ---\n" + output).strip()
        ctx.send(
            {
                "event": "result",
                "id": ctx.task_id,
                "verdict": verdict.to_json(),
                "restart": restart,
                "deps": dependency_file_stamps(ctx.task_deps),
            }
        )
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
