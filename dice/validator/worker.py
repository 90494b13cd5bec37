"""The worker process: ``python -m dice.validator.worker RESULT_FD``.

It reads one JSON task per line on stdin and writes JSON events to the inherited file descriptor
RESULT_FD (stdout and stderr go to a log file, so candidate output can never corrupt the protocol):
``{"event": "ready"}`` once, then per task any number of
``{"event": "phase", "phase": "build"|"wait_gpu"|"run"}`` and one
``{"event": "result", "verdict": {...}, "restart": bool}``. The pool applies its deadlines per phase and
kills the whole process group when one passes.
"""

from __future__ import annotations

import faulthandler
import fcntl
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

from dice.validator.verdict import Verdict, error_verdict


class Integrity:
    """Identities of the library functions timing and comparison rely on, taken before any candidate runs."""

    def __init__(self) -> None:
        self._owners = self._collect_owners()
        self._snapshot = {
            (prefix, name): value
            for prefix, owner in self._owners.items()
            for name, value in vars(owner).items()
            if callable(value) or isinstance(value, (staticmethod, classmethod, property))
        }

    @staticmethod
    def _collect_owners() -> dict[str, Any]:
        import time as time_module

        owners: dict[str, Any] = {"time": time_module}
        if "torch" in sys.modules:
            import torch
            import torch.nn.functional as functional

            owners.update(
                {
                    "torch": torch,
                    "torch.Tensor": torch.Tensor,
                    "torch.nn.functional": functional,
                    "torch.nn.Module": torch.nn.Module,
                    "torch.cuda": torch.cuda,
                    "torch.cuda.Event": torch.cuda.Event,
                    "torch.testing": torch.testing,
                    "torch.autograd.grad_mode": torch.autograd.grad_mode,
                }
            )
        return owners

    def violations(self) -> list[str]:
        out = []
        for (prefix, name), value in self._snapshot.items():
            if vars(self._owners[prefix]).get(name) is not value:
                out.append(f"{prefix}.{name}")
        return out


class WorkerContext:
    """What a task needs from its worker: the GPU (if any), folders, the GPU lock and phase reports."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.gpu = os.environ.get("DICE_WORKER_GPU") == "1"
        self.cache_dir = Path(os.environ["DICE_WORKER_CACHE"])
        self.workdir = Path.cwd()
        self.log_path = Path(os.environ["DICE_WORKER_LOG"])
        self.gpu_lock_path = os.environ.get("DICE_GPU_LOCK")
        self.arch: str | None = None
        self.device_name: str | None = None
        self.task_id: int | None = None
        self._lock_fd: int | None = None
        self._task_counter = 0
        if self.gpu:
            import torch

            torch.cuda.init()
            major, minor = torch.cuda.get_device_capability()
            self.arch = f"{major}{minor}"
            self.device_name = torch.cuda.get_device_name()
            # One architecture only: load_inline otherwise builds for every arch it knows.
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
            import torch.profiler
            import torch.utils.cpp_extension  # noqa: F401 - imported before the integrity snapshot

            # CUPTI's first start costs seconds; pay it here, in parallel with other workers, not under the
            # GPU lock during the kernel-launch check.
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
                torch.ones(1, device="cuda").add_(1)
                torch.cuda.synchronize()
        self.integrity = Integrity()

    def send(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def phase(self, name: str) -> None:
        self.send({"event": "phase", "id": self.task_id, "phase": name})

    def acquire_gpu(self) -> None:
        """Take this GPU's lock (shared by every pool on the machine), so runs and timings never overlap."""
        self.phase("wait_gpu")
        if self.gpu_lock_path and self._lock_fd is None:
            fd = os.open(self.gpu_lock_path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._lock_fd = fd
        self.phase("run")

    def release_gpu(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def task_dir(self) -> Path:
        self._task_counter += 1
        path = self.workdir / f"task{self._task_counter}"
        path.mkdir(parents=True, exist_ok=True)
        return path


def _run_task(ctx: WorkerContext, task: dict[str, Any]) -> tuple[Verdict, bool]:
    kind = task.get("kind")
    if kind == "cu":
        from dice.validator.cu import run_cu

        return run_cu(ctx, task)
    if kind == "kernelbench":
        from dice.validator.kernelbench import run_kernelbench

        return run_kernelbench(ctx, task)
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
    info = {
        "pid": os.getpid(),
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
    out = os.fdopen(int(argv[0]), "w", buffering=1)
    faulthandler.enable(all_threads=True)
    try:
        ctx = WorkerContext(out)
    except Exception as exc:  # noqa: BLE001 - reported to the pool, which gives up on this slot
        out.write(json.dumps({"event": "fatal", "message": f"{type(exc).__name__}: {exc}"}) + "\n")
        out.flush()
        return 1
    ctx.send(
        {"event": "ready", "pid": os.getpid(), "gpu": ctx.gpu, "device": ctx.device_name, "arch": ctx.arch}
    )
    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        ctx.task_id = task.get("id")
        log_start = _log_size(ctx.log_path)
        restart = False
        try:
            verdict, restart = _run_task(ctx, task)
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
        ctx.send({"event": "result", "id": ctx.task_id, "verdict": verdict.to_json(), "restart": restart})
    return 0


if __name__ == "__main__":
    sys.exit(main())
