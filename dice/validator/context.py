"""What a task receives from its worker process: :class:`WorkerContext` (the GPU if any, folders, the GPU
lock, phase reports) and :class:`Integrity` (the library functions a candidate must leave alone).

The task modules (:mod:`dice.validator.cu`, :mod:`dice.validator.kernelbench`) import this module, never
:mod:`dice.validator.worker`, which imports them to dispatch tasks.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from dice.validator.limits import NVCC_TIMEOUT_S, NVRTC_TIMEOUT_S


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
        # the CPU tests' stand-in for the GPU path: the KernelBench run, judge and runner, on the CPU
        self.emulated = not self.gpu and os.environ.get("DICE_VALIDATOR_EMULATE") == "cpu"
        self._zygote: Any = None
        self.cache_dir = Path(os.environ["DICE_WORKER_CACHE"])
        self.workdir = Path.cwd()
        self.log_path = Path(os.environ["DICE_WORKER_LOG"])
        self.gpu_lock_path = os.environ.get("DICE_GPU_LOCK")
        self.arch: str | None = None
        self.device_name: str | None = None
        self.task_id: int | None = None
        # files the task's verdict depends on beside its text (headers nvcc read): the pool re-checks their
        # stamps before it answers the same task from its verdict cache; reset for every task
        self.task_deps: list[str] = []
        self._lock_fd: int | None = None
        self._task_counter = 0
        # the compile checks' deadlines and memory cap (dice.validator.limits), set per task by the pool
        self.nvrtc_timeout_s = NVRTC_TIMEOUT_S
        self.nvcc_timeout_s = NVCC_TIMEOUT_S
        self.compile_memory_bytes: int | None = None
        if self.gpu:
            import torch

            torch.cuda.init()
            major, minor = torch.cuda.get_device_capability()
            self.arch = f"{major}{minor}"
            self.device_name = torch.cuda.get_device_name()
            # One architecture only: load_inline otherwise builds for every arch it knows.
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
            import torch.utils.cpp_extension  # noqa: F401 - imported before the integrity snapshot
            # (no CUPTI warm-up here: the kernel-launch check profiles in the candidate's runner)
        if self.emulated:
            self.device_name = "CPU (the GPU path emulated)"
        self.integrity = Integrity()

    @property
    def zygote(self) -> Any:
        """The runner zygote (:mod:`dice.validator.zygote`), started on first use and after it died."""
        if self._zygote is None:
            from dice.validator.zygote_client import Zygote

            self._zygote = Zygote()
        return self._zygote

    def close(self) -> None:
        if self._zygote is not None:
            self._zygote.close()

    def set_limits(self, limits: dict[str, Any] | None) -> None:
        """A task's compile limits (``{"nvrtc_s", "nvcc_s", "memory_bytes"}``; missing: the defaults)."""
        limits = limits or {}
        self.nvrtc_timeout_s = float(limits.get("nvrtc_s") or NVRTC_TIMEOUT_S)
        self.nvcc_timeout_s = float(limits.get("nvcc_s") or NVCC_TIMEOUT_S)
        memory = limits.get("memory_bytes")
        self.compile_memory_bytes = int(memory) if memory else None

    def send(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def phase(self, name: str) -> None:
        self.send({"event": "phase", "id": self.task_id, "phase": name})

    def acquire_gpu(self) -> None:
        """Take this GPU's lock (shared by every pool on the machine), so runs and timings never overlap;
        GpuBusy after ``$DICE_GPU_LOCK_WAIT_S`` (default 300) seconds of waiting.

        A POSIX record lock (``lockf``), not ``flock``: it belongs to this process alone, so a child that
        candidate code forks (a ``setsid`` daemon) does not inherit it, and it goes when this worker exits
        or is killed. (With ``flock`` such a daemon held the lock for every pool on the machine.)"""
        self.phase("wait_gpu")
        if self.gpu_lock_path and self._lock_fd is None:
            fd = os.open(self.gpu_lock_path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
            try:
                _lock_within(fd, float(os.environ.get("DICE_GPU_LOCK_WAIT_S") or GPU_LOCK_WAIT_S))
            except GpuBusy as exc:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise GpuBusy(f"{exc} (held by pid {holder}; lock file {self.gpu_lock_path})") from None
            except BaseException:
                os.close(fd)
                raise
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._lock_fd = fd
        self.phase("run")

    def release_gpu(self) -> None:
        if self._lock_fd is not None:
            fcntl.lockf(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def task_dir(self) -> Path:
        self._task_counter += 1
        path = self.workdir / f"task{self._task_counter}"
        path.mkdir(parents=True, exist_ok=True)
        return path


GPU_LOCK_WAIT_S = 300.0


class GpuBusy(TimeoutError):
    """The GPU lock was not free within its deadline (the task's verdict: ``timeout``)."""


def _lock_within(fd: int, seconds: float) -> None:
    """Block on a POSIX write lock of ``fd`` for at most ``seconds`` (the kernel's queue keeps waiters in
    order; an interval timer interrupts the wait in the main thread, polling elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        deadline = time.monotonic() + seconds
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise GpuBusy(f"the GPU stayed busy for {seconds:g} s") from None
                time.sleep(0.05)

    def expired(signum: int, frame: object) -> None:
        raise GpuBusy(f"the GPU stayed busy for {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
