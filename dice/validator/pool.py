"""The validator pool: worker subprocesses that compile, check and time candidates, never in the caller.

One pool spans the visible GPUs (worker ``i`` is pinned to GPU ``i % n`` through ``CUDA_VISIBLE_DEVICES``).
Builds run in parallel in all workers; running and timing take the GPU's file lock, shared by every pool on
the machine, so timings never overlap. Each task has per-phase deadlines (build, then run): when one passes,
the worker's whole process group is killed and a fresh worker replaces it; a worker that crashes (segfault,
illegal address) costs only its task. Workers run in their own temporary folder (cwd, HOME and TMPDIR).

A ``.cu`` task's compilers have editor-sized deadlines of their own, enforced in the worker
(:mod:`dice.validator.limits`: NVRTC and nvcc run in killable children under a memory cap), so a macro bomb
costs its deadline, not the worker. Workers die with their owner (``PR_SET_PDEATHSIG``, and a watchdog on
the result pipe: :mod:`dice.validator.lifeline`); a worker folder records its owner, and folders of owners
that no longer run are removed when the next pool starts. Workers are sandboxed (:mod:`.sandbox`): verdict
logs end with the ``isolation:`` in force.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import queue
import select
import shutil
import signal
import site
import subprocess
import tempfile
import threading
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dice.validator.build_flags import BuildOptions
from dice.validator.compdb import database_stamps
from dice.validator.lifeline import (
    WORKER_PREFIX,
    kill_session,
    remove_stale_folders,
    start_time,
    write_owner,
)
from dice.validator.limits import NVCC_TIMEOUT_S, NVRTC_TIMEOUT_S
from dice.validator.paths import cache_dir, source_hash
from dice.validator.reference import check_reference
from dice.validator.sandbox import choose, describe, sandboxed, sandboxed_pid
from dice.validator.spec_files import dependency_stamps, stamps_current
from dice.validator.spec_origin import SpecOrigin, fill_changes_spec, marker_change
from dice.validator.verdict import Verdict, error_verdict

STARTUP_TIMEOUT_S = 180.0
# The build phase of a .cu task beyond its NVRTC and nvcc deadlines (parsing, extraction, the nvcc cache):
# past it the pool kills the worker, as for any phase.
CU_BUILD_MARGIN_S = 60.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def gpu_available() -> bool:
    """Whether a CUDA GPU is usable here (``DICE_VALIDATOR_GPU=0`` forces compile-only validation)."""
    if os.environ.get("DICE_VALIDATOR_GPU", "").strip() in ("0", "false", "no"):
        return False
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver means no GPU
        return False


def _gpu_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001
        return 0


class _WorkerGone(Exception):
    pass


class _Worker:
    """One worker subprocess: JSON tasks on stdin, JSON events on a private pipe, output to a log file."""

    def __init__(self, *, gpu_index: int | None, cache: Path, max_jobs: int, isolation: str = "none") -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=WORKER_PREFIX))
        write_owner(self.workdir)
        (self.workdir / "tmp").mkdir()
        self.log_path = self.workdir / "worker.log"
        self.tasks_done, self.kind = 0, isolation
        env = dict(os.environ)
        env.update(
            {
                "PYTHONPATH": os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p),
                # HOME moves to the temp dir; keep user-installed packages importable.
                "PYTHONUSERBASE": site.getuserbase(),
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1",
                "HOME": str(self.workdir),
                "TMPDIR": str(self.workdir / "tmp"),
                "DICE_WORKER_CACHE": str(cache),
                "DICE_WORKER_LOG": str(self.log_path),
                "DICE_WORKER_GPU": "1" if gpu_index is not None else "0",
                "CUPY_CACHE_DIR": str(cache / "cupy"),
                "TORCH_EXTENSIONS_DIR": str(cache / "torch_ext"),
                "MAX_JOBS": str(max_jobs),
                "DICE_WORKER_OWNER": str(os.getpid()),
            }
        )
        if gpu_index is not None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = [s for s in visible.split(",") if s.strip()] if visible else None
            physical = ids[gpu_index] if ids and gpu_index < len(ids) else str(gpu_index)
            env["CUDA_VISIBLE_DEVICES"] = physical
            locks = cache / "locks"
            locks.mkdir(parents=True, exist_ok=True)
            env["DICE_GPU_LOCK"] = str(locks / f"gpu{physical}.lock")
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
        read_fd, write_fd = os.pipe()
        argv, env, fds, info = sandboxed(  # the env allow-list; bwrap's command line
            env, isolation=isolation, workdir=self.workdir, cache=cache, result_fd=write_fd
        )
        self._log_file = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                pass_fds=fds,
                start_new_session=True,
            )
        finally:
            list(map(os.close, fds))  # the worker's ends
        self.started = start_time(self.proc.pid)
        self._read_fd = read_fd
        self._buffer = b""
        self.info = self.recv(STARTUP_TIMEOUT_S)
        self.pid = sandboxed_pid(info) or self.proc.pid  # under bwrap, self.proc is bwrap (kill: the sandbox)
        with contextlib.suppress(OSError):
            write_owner(self.workdir, worker=self.pid)
        if self.info is None or self.info.get("event") != "ready":
            detail = (self.info or {}).get("message") or self.log_tail()
            self.kill()
            raise _WorkerGone(f"validator worker failed to start: {detail}")
        self.isolation = str(self.info.get("isolation") or describe(isolation))

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise _WorkerGone(str(exc)) from exc

    def recv(self, timeout: float | None) -> dict[str, Any] | None:
        """The next event, None on timeout; raises ``_WorkerGone`` when the worker exited."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            ready, _, _ = select.select([self._read_fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self._read_fd, 65536)
            if not chunk:
                raise _WorkerGone("worker exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def log_tail(self, limit: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode("utf-8", "replace")

    def exit_description(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "worker stopped answering"
        if code > 128 and self.kind == "bwrap":  # bwrap's init exits 128 + the signal that killed the worker
            code = 128 - code
        if code < 0:
            try:
                return f"worker killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"worker killed by signal {-code}"
        return f"worker exited with code {code}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        # what the worker started in process groups of its own (nvcc and its compilers) is in its session
        kill_session(self.proc.pid, not_before=self.started)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for closer in (
            lambda: os.close(self._read_fd),
            self._log_file.close,
            lambda: self.proc.stdin.close() if self.proc.stdin else None,
        ):
            with contextlib.suppress(OSError):
                closer()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def close(self) -> None:
        """Graceful stop: EOF on stdin ends the loop; kill if it lingers."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


@dataclass
class _Task:
    payload: dict[str, Any]
    future: concurrent.futures.Future[Verdict]
    cache_key: str | None
    cache_generation: int = 0


class ValidatorPool:
    """Validate candidates in isolated worker processes. Use as a context manager or call :meth:`close`.

    ``workers``: parallel slots (default: up to 8 with a GPU, since builds are CPU-bound and runs are
    serialised per GPU; up to 4 without). ``timeout_s`` bounds the run phase (a kernel that never ends),
    ``build_timeout_s`` the compile phase (a cold ``load_inline`` build takes tens of seconds).
    ``nvrtc_timeout_s`` and ``nvcc_timeout_s`` bound a ``.cu`` task's compilers (a fill's NVRTC check takes
    0.04 s to 1.4 s, nvcc 2 s to 13 s), each compiler process limited to ``compile_memory_mb`` of address
    space (None: :func:`dice.validator.limits.compile_memory_bytes`); the task's whole build phase then
    gets their sum plus :data:`CU_BUILD_MARGIN_S`, at most ``build_timeout_s``.
    Identical requests are answered from an in-memory verdict cache. ``prewarm`` workers are started at
    once in the background. ``sandbox``: auto | required | off | bwrap | fallback (None: ``$DICE_SANDBOX``;
    :mod:`dice.validator.sandbox`); ``SandboxUnavailable`` when unmet, before any worker starts.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        timeout_s: float = 60.0,
        gpu: bool | None = None,
        build_timeout_s: float = 300.0,
        max_tasks_per_worker: int = 64,
        cache_verdicts: bool = True,
        prewarm: int = 0,
        nvrtc_timeout_s: float = NVRTC_TIMEOUT_S,
        nvcc_timeout_s: float = NVCC_TIMEOUT_S,
        compile_memory_mb: int | None = None,
        sandbox: str | None = None,
    ) -> None:
        self.sandbox = choose(sandbox)  # bwrap | fallback | none; raises before anything starts
        self.isolation = describe(self.sandbox)  # then what the last worker reported
        self.gpu = gpu_available() if gpu is None else bool(gpu) and gpu_available()
        cpus = os.cpu_count() or 2
        n_gpus = max(1, _gpu_count()) if self.gpu else 0
        if workers is None:
            workers = min(8, cpus) if self.gpu else max(1, min(4, cpus))
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.workers = workers
        self.timeout_s = float(timeout_s)
        self.build_timeout_s = float(build_timeout_s)
        self.nvrtc_timeout_s = float(nvrtc_timeout_s)
        self.nvcc_timeout_s = float(nvcc_timeout_s)
        self._limits = {
            "nvrtc_s": self.nvrtc_timeout_s,
            "nvcc_s": self.nvcc_timeout_s,
            "memory_bytes": None if compile_memory_mb is None else int(compile_memory_mb) << 20,
        }
        # worker folders of owners that were killed (SIGKILL leaves no time to remove them)
        self.removed_stale = remove_stale_folders(Path(tempfile.gettempdir()))
        self.max_tasks_per_worker = max_tasks_per_worker
        self.cache_dir = cache_dir()
        self._max_jobs = max(2, cpus // workers)
        self._gpu_indices = [i % n_gpus if self.gpu else None for i in range(workers)]
        self._queue: queue.Queue[_Task | None] = queue.Queue()
        # key -> (verdict, stamps of the files it depends on beside its text)
        self._verdicts: OrderedDict[str, tuple[Verdict, list[Any]]] | None = (
            OrderedDict() if cache_verdicts else None
        )
        self._cache_lock = threading.Lock()
        self._cache_generation = 0  # bumped by clear_cache: older tasks' verdicts are not stored
        self._closed = False
        self._live: list[_Worker | None] = [None] * workers
        # A GPU worker takes ~10 s to start (torch, CUDA context, CUPTI); an editor starts some up front.
        self._prewarm = min(max(0, prewarm), workers)
        self._threads = [
            threading.Thread(target=self._slot_loop, args=(i,), name=f"dice-validator-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------------------------------ public
    def validate_cu(
        self,
        text: str,
        *,
        run: bool = True,
        filename: str = "kernel.cu",
        folder: str | os.PathLike[str] | None = None,
        build: BuildOptions | None = None,
        spec_origin: SpecOrigin | None = None,
    ) -> Verdict:
        return self.submit_cu(
            text, run=run, filename=filename, folder=folder, build=build, spec_origin=spec_origin
        ).result()

    def validate_kernelbench(
        self, ref_src: str, cand_src: str, *, strict: bool = False, timing: bool = True
    ) -> Verdict:
        return self.submit_kernelbench(ref_src, cand_src, strict=strict, timing=timing).result()

    def submit_cu(
        self,
        text: str,
        *,
        run: bool = True,
        filename: str = "kernel.cu",
        folder: str | os.PathLike[str] | None = None,
        build: BuildOptions | None = None,
        spec_origin: SpecOrigin | None = None,
        not_run: str | None = None,
    ) -> concurrent.futures.Future[Verdict]:
        """Compile a ``.cu`` file (NVRTC on its device code, nvcc on the whole file with its project's
        flags); with a dice-spec, a GPU and ``run``, also run and time it.

        ``folder``: the folder of the user's file (None: unknown). Its compile command is looked up from
        there (``compile_commands.json`` in it, an ancestor or a ``build*/`` folder), its relative includes
        resolve as in place, and the dice-spec can import modules beside the file (``import ref``), read
        afresh for every task. ``build``: an explicit database, include paths, defines, workspace root
        (:class:`~dice.validator.build_flags.BuildOptions`). The verdict cache keys on all of these, on the
        database's stamp, and on the stamps of every project header nvcc read; :meth:`clear_cache`
        forgets verdicts when a file a dice-spec imports changes.

        ``spec_origin``: for a text with model fills spliced in, the user's spec from the file before the
        splice (:func:`dice.validator.spec_origin.spec_origin`). It is the spec run, and a text that shows
        another (a fill with its own ``dice-spec``, one that comments out or ``#if 0``-s the user's) is
        ``rejected`` (``fill_changes_spec``) before anything is compiled; an added marker already here.

        ``not_run``: why the file's code must not be run (an untrusted workspace): compile-only, whatever
        ``run`` says, and the verdict gives this reason (flag ``workspace_not_trusted``).
        """
        if spec_origin is not None:
            added = marker_change(spec_origin, text)
            if added is not None:
                done: concurrent.futures.Future[Verdict] = concurrent.futures.Future()
                done.set_result(fill_changes_spec(added))
                return done
        payload = {
            "kind": "cu",
            "text": text,
            "run": bool(run) and not not_run,
            "not_run": not_run or None,
            "filename": Path(filename).name,
            "folder": None if folder is None else os.path.abspath(os.fspath(folder)),
            "build": None if build is None else build.to_json(),
            "spec_origin": None if spec_origin is None else spec_origin.to_json(),
            "limits": self._limits,
        }
        stamps = dependency_stamps(text, payload["folder"], payload["filename"])
        databases = database_stamps(payload["folder"], build.compile_commands if build else None)
        return self._submit(payload, key_extra=[stamps, databases])

    def submit_kernelbench(
        self,
        ref_src: str,
        cand_src: str,
        *,
        strict: bool = False,
        timing: bool = True,
        not_run: str | None = None,
        stop_below: float | None = None,
    ) -> concurrent.futures.Future[Verdict]:
        """Validate a ``ModelNew`` candidate against a KernelBench reference. ``not_run``: why neither may be
        run (an untrusted workspace): only the static checks of a machine without a GPU, with this reason.
        ``stop_below``: a dataset build's cut-off; timing ends after its pilot rounds for a candidate whose
        speedup so far is below it (the verdict is flagged ``timing_stopped_early``).

        Raises ``InvalidReference`` (a ``ValueError``) at once if the reference is not a KernelBench problem.
        """
        check_reference(ref_src)
        return self._submit(
            {
                "kind": "kernelbench",
                "ref_src": ref_src,
                "cand_src": cand_src,
                "strict": bool(strict),
                "timing": bool(timing),
                "not_run": not_run or None,
                "stop_below": float(stop_below) if stop_below else None,
            }
        )

    def submit_prebuild(
        self, cand_srcs: list[str], refs: list[str] | None = None
    ) -> concurrent.futures.Future[dict[str, Any]]:
        """Build the ``load_inline`` extensions of many KernelBench candidates (e.g. the samples of one RL
        task) as few combined extensions, in one worker (:mod:`dice.validator.batchbuild`); their later
        KernelBench tasks, in any worker, are then served from them. Submit it before those tasks: a task
        whose extension it is building waits for it. The result: ``{"candidates": [{"index", "status":
        "batched" | "cached" | "alone" | "failed", "reason", "seconds", "keys"}], "builds": [...],
        "seconds"}``; ``alone`` and ``failed`` candidates build in their own task as before (``failed``: its
        code failed in a combined build). ``refs``: the candidates' references (same order), whose init
        inputs construct a ``ModelNew`` that builds in ``__init__``. Never raises for a candidate; a worker
        failure gives ``"error"`` and every candidate ``alone``."""
        payload = {"kind": "kb_prebuild", "cand_srcs": [str(s) for s in cand_srcs], "ref_srcs": refs}
        inner = self._submit(payload, use_cache=False)
        outer: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()

        def finished(done: concurrent.futures.Future[Verdict]) -> None:
            verdict = done.result()
            report: dict[str, Any] | None = None
            if verdict.status == "compiled":
                with contextlib.suppress(ValueError, TypeError):
                    report = json.loads(verdict.message)
            if report is None:
                report = {
                    "error": verdict.message,
                    "candidates": [
                        {
                            "index": i,
                            "status": "alone",
                            "reason": f"prebuild failed: {verdict.message}",
                            "seconds": 0.0,
                        }
                        for i in range(len(cand_srcs))
                    ],
                    "builds": [],
                }
            if outer.set_running_or_notify_cancel():
                outer.set_result(report)

        inner.add_done_callback(finished)
        return outer

    def clear_cache(self) -> None:
        """Forget every cached verdict (a file a dice-spec depends on changed). Tasks already submitted
        do not store theirs: they may have read the old file."""
        with self._cache_lock:
            self._cache_generation += 1
            if self._verdicts is not None:
                self._verdicts.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=30)
        for i, worker in enumerate(self._live):
            if worker is not None:
                worker.close()
                self._live[i] = None

    def __enter__(self) -> ValidatorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()

    # ------------------------------------------------------------------------------------------ internals
    def _submit(
        self, payload: dict[str, Any], *, use_cache: bool = True, key_extra: Any = None
    ) -> concurrent.futures.Future[Verdict]:
        if self._closed:
            raise RuntimeError("the validator pool is closed")
        future: concurrent.futures.Future[Verdict] = concurrent.futures.Future()
        key = None
        if self._verdicts is not None and use_cache:
            key = source_hash(
                json.dumps(payload, sort_keys=True), json.dumps(key_extra), str(self.gpu), length=32
            )
            with self._cache_lock:
                hit = self._verdicts.get(key)
                if hit is not None:
                    self._verdicts.move_to_end(key)
            if hit is not None and stamps_current(hit[1]):
                copy = Verdict.from_json(hit[0].to_json())
                copy.depends = list(hit[1])
                future.set_result(copy)
                return future
        self._queue.put(_Task(payload, future, key, self._cache_generation))
        return future

    def _slot_loop(self, slot: int) -> None:
        if slot < self._prewarm:
            with contextlib.suppress(_WorkerGone):
                self._worker(slot)
        while True:
            task = self._queue.get()
            if task is None:
                return
            if not task.future.set_running_or_notify_cancel():
                continue
            deps: list[Any] = []
            try:
                verdict, deps = self._run(slot, task.payload)
            except Exception as exc:  # noqa: BLE001 - never leave a future unresolved
                verdict = error_verdict(
                    "runtime_error", f"validator internal error: {exc}", traceback.format_exc()
                )
            ran_in = self._live[slot]  # the worker that ran this task (each reports its own isolation)
            isolation = ran_in.isolation if ran_in is not None else self.isolation
            verdict.log = f"{verdict.log}\nisolation: {isolation}".lstrip("\n")
            if (
                task.cache_key is not None
                and self._verdicts is not None
                and verdict.status not in ("timeout", "runtime_error")
            ):
                with self._cache_lock:
                    if task.cache_generation == self._cache_generation:
                        self._verdicts[task.cache_key] = (verdict, deps)
                        while len(self._verdicts) > 1024:
                            self._verdicts.popitem(last=False)
            task.future.set_result(verdict)

    def _worker(self, slot: int) -> _Worker:
        worker = self._live[slot]
        if worker is not None and worker.proc.poll() is None:
            return worker
        if worker is not None:
            worker.kill()
        gpu, sandbox = self._gpu_indices[slot], self.sandbox
        worker = _Worker(gpu_index=gpu, cache=self.cache_dir, max_jobs=self._max_jobs, isolation=sandbox)
        self._live[slot] = worker
        self.isolation = worker.isolation
        return worker

    def _retire(self, slot: int) -> None:
        worker = self._live[slot]
        if worker is not None:
            worker.kill()
            self._live[slot] = None

    def _run(self, slot: int, payload: dict[str, Any]) -> tuple[Verdict, list[Any]]:
        """The task's verdict and the stamps of the files it read (for the verdict cache)."""
        try:
            worker = self._worker(slot)
        except _WorkerGone as exc:
            return error_verdict("runtime_error", str(exc)), []
        task_id = worker.tasks_done + 1
        phase = "build"
        build = self.build_timeout_s
        if payload.get("kind") == "cu":
            build = min(build, self.nvrtc_timeout_s + self.nvcc_timeout_s + CU_BUILD_MARGIN_S)
        limits = {"build": build, "wait_gpu": None, "run": self.timeout_s}
        started = time.monotonic()
        try:
            worker.send({**payload, "id": task_id, "worker_pid": worker.pid})
            while True:
                limit = limits.get(phase, self.timeout_s)
                remaining = None if limit is None else max(0.0, limit - (time.monotonic() - started))
                event = worker.recv(remaining)
                if event is None:
                    self._retire(slot)
                    return Verdict(
                        "timeout",
                        phase == "run",
                        None,
                        message=f"timed out: the {phase} phase exceeded {limit:.0f} s; the worker was killed "
                        "and replaced",
                    ), []
                if event.get("event") == "phase":
                    phase = str(event.get("phase"))
                    started = time.monotonic()
                elif event.get("event") == "result":
                    worker.tasks_done += 1
                    verdict = Verdict.from_json(event["verdict"])
                    verdict.depends = list(event.get("deps") or [])
                    if event.get("restart") or worker.tasks_done >= self.max_tasks_per_worker:
                        self._retire(slot)
                    return verdict, verdict.depends
        except _WorkerGone:
            description = worker.exit_description()
            tail = worker.log_tail()
            self._retire(slot)
            return Verdict(
                "runtime_error",
                phase == "run",
                None,
                message=f"{description} during the {phase} phase (the worker was replaced)",
                log=tail,
            ), []
