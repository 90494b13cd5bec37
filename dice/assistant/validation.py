"""The validator's owner for the assistant: the worker pool (created on first use unless one is passed in),
the verdict cache, and awaiting verdicts under a request's deadline and cancellation. It is also the one
gate on running the workspace's code: unless ``trusted``, every task is compile-only
(``rules.code_run_refusal``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dice.assistant.caches import LRU, digest
from dice.assistant.request import Request
from dice.assistant.rules import code_run_refusal

if TYPE_CHECKING:
    from dice.assistant.settings import AssistantSettings
    from dice.validator import ValidatorPool, Verdict
    from dice.validator.build_flags import BuildOptions
    from dice.validator.spec_origin import SpecOrigin


class Validation:
    """Validates whole-file texts and programs in the pool's worker processes, never in this process."""

    def __init__(self, pool: ValidatorPool | None, *, cache_size: int, stats: dict[str, int]) -> None:
        self._pool_obj = pool
        self._owned = pool is None
        self._lock = threading.Lock()
        self._gpu: bool | None = None
        self._verdicts: LRU[str, Verdict] = LRU(cache_size)
        self._stats = stats
        self.trusted = False  # the settings' trusted_workspace (AssistantService keeps it in step)

    @property
    def not_run(self) -> str | None:
        """Why nothing may be run here (an untrusted workspace), or None."""
        return code_run_refusal(self.trusted)

    @property
    def gpu(self) -> bool:
        """Whether candidates can be run and timed (a CUDA GPU is visible); else verdicts are compile-only."""
        if self._gpu is None:
            from dice.validator import gpu_available

            self._gpu = bool(gpu_available())
        return self._gpu

    def pool(self) -> ValidatorPool:
        with self._lock:
            if self._pool_obj is None:
                from dice.validator import ValidatorPool

                self._pool_obj = ValidatorPool()
            return self._pool_obj

    def invalidate(self) -> None:
        """Forget every cached verdict, here and in the pool (a file the verdicts depended on changed)."""
        self._verdicts.clear()
        with self._lock:
            pool = self._pool_obj
        if pool is not None:
            pool.clear_cache()

    async def texts(
        self,
        request: Request,
        texts: list[str],
        *,
        level: str,
        filename: str | Path | None,
        build: BuildOptions | None = None,
        done_before: int,
        total: int,
        spec: SpecOrigin | None = None,
    ) -> list[Verdict | None]:
        """Verdicts of whole-file texts, in parallel on the pool; None for those the deadline cut off
        (text 0, the greedy fill, is always awaited). ``level`` "none" validates nothing. ``spec``: the
        user's spec from the file before the fills were spliced in: the one run, and texts that show
        another are rejected (:mod:`dice.validator.spec_origin`)."""
        if level == "none":
            return [None] * len(texts)
        # the same text under another name gets its own verdict: the log names the file
        context = verdict_context(texts[0], filename, build) if texts else None
        origin = None if spec is None else spec.to_json()
        not_run = self.not_run
        keys = [digest("verdict", t, level, context, origin, not_run) for t in texts]
        # a cached verdict whose headers (or database, or spec modules) changed since is computed again
        verdicts: list[Verdict | None] = [_current(self._verdicts.get(k)) for k in keys]
        missing = [i for i, v in enumerate(verdicts) if v is None]
        if not missing:
            return verdicts
        pool = await asyncio.to_thread(self.pool)
        futures: list[concurrent.futures.Future[Verdict] | None] = [None] * len(texts)
        for i in missing:
            futures[i] = pool.submit_cu(
                texts[i],
                run=(level == "run"),
                build=build,
                spec_origin=spec,
                not_run=not_run,
                **file_kwargs(filename),
            )
        fresh = await self.wait(
            request,
            futures,
            verdicts,
            required={0},
            label="validating candidates",
            done_before=done_before,
            total=total,
        )
        for i in missing:
            verdict = fresh[i]
            if verdict is not None:
                self._verdicts.put(keys[i], verdict)
        return fresh

    async def programs(
        self, request: Request, ref_src: str, sources: list[str], *, timing: bool
    ) -> list[Any]:
        """KernelBench verdicts of whole programs for one reference (no deadline applies)."""
        pool = await asyncio.to_thread(self.pool)
        not_run = self.not_run
        futures = [pool.submit_kernelbench(ref_src, src, timing=timing, not_run=not_run) for src in sources]
        return await self.wait(
            request, futures, [None] * len(sources), required=set(), label="validating programs"
        )

    async def document(
        self, text: str, *, run: bool, filename: str | Path | None, build: BuildOptions | None = None
    ) -> Verdict:
        pool = await asyncio.to_thread(self.pool)
        future = pool.submit_cu(text, run=run, build=build, not_run=self.not_run, **file_kwargs(filename))
        self._stats["validations"] += 1
        return await asyncio.wrap_future(future)

    async def wait(
        self,
        request: Request,
        futures: Sequence[concurrent.futures.Future[Verdict] | None],
        known: Sequence[Verdict | None],
        *,
        required: set[int],
        label: str,
        done_before: int = 0,
        total: int | None = None,
    ) -> list[Verdict | None]:
        """Await ``futures`` (``known`` holds the answers already there). Past the deadline, results not in
        ``required`` are left as None and the request is marked partial; cancelling stops waiting at once
        and drops what is pending."""
        results = list(known)
        total = total if total is not None else len(futures)
        waiting: dict[asyncio.Future[Verdict], int] = {
            asyncio.wrap_future(f): i for i, f in enumerate(futures) if f is not None
        }
        done_count = done_before + (len(futures) - len(waiting))
        request.emit("validating", done_count, total, label)
        cancel_task = asyncio.ensure_future(request.cancel.wait()) if request.cancel is not None else None
        try:
            while waiting:
                if request.cancelled:
                    raise asyncio.CancelledError("request cancelled")
                need = any(i in required for i in waiting.values())
                remaining = max(0.0, request.deadline - time.monotonic())
                timeout = None if need or math.isinf(request.deadline) else remaining
                wait_on: set[asyncio.Future[Any]] = set(waiting)
                if cancel_task is not None:
                    wait_on.add(cancel_task)
                done, _ = await asyncio.wait(wait_on, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done:  # deadline: keep what is validated
                    request.partial = True
                    break
                for fut in done:
                    if fut is cancel_task:
                        continue
                    i = waiting.pop(fut)
                    results[i] = fut.result()
                    self._stats["validations"] += 1
                    done_count += 1
                    request.emit("validating", done_count, total, label)
        finally:
            for fut in waiting:
                fut.cancel()
            if cancel_task is not None:
                cancel_task.cancel()
        if request.cancelled:
            raise asyncio.CancelledError("request cancelled")
        return results

    def close(self) -> None:
        with self._lock:
            pool, self._pool_obj = self._pool_obj, None
        if self._owned and pool is not None:
            pool.close()


def verdict_context(
    text: str, filename: str | Path | None, build: BuildOptions | None = None
) -> tuple[Any, ...]:
    """What a verdict of ``text`` rests on besides the text, for cache keys: the file's path (its name is in
    the compiler log; its folder finds the compile command and resolves relative includes), the build
    options, the stamps of the compile database and of the files the dice-spec imports. The headers nvcc
    read are checked on every cache hit instead (``Verdict.depends``)."""
    from dice.validator.compdb import database_stamps
    from dice.validator.spec_files import dependency_stamps

    kwargs = file_kwargs(filename)
    base, folder = kwargs.get("filename"), kwargs.get("folder")
    explicit = build.compile_commands if build is not None else None
    return (
        None if filename is None else str(filename),
        None if build is None else build.to_json(),
        dependency_stamps(text, folder, base or "kernel.cu"),
        database_stamps(folder, explicit),
    )


def build_options(settings: AssistantSettings, workspace_root: str | None) -> BuildOptions:
    """The validator's build options from the user's settings (compileCommands, includePaths, defines)."""
    from dice.validator.build_flags import BuildOptions

    return BuildOptions(
        compile_commands=settings.compile_commands or None,
        include_paths=settings.include_paths,
        defines=settings.defines,
        workspace_root=workspace_root,
    )


def _current(verdict: Verdict | None) -> Verdict | None:
    return verdict if verdict is not None and verdict.current else None


def file_kwargs(filename: str | Path | None) -> dict[str, Any]:
    """The pool's keywords for the user's file: its base name (compiler logs name it) and, for a path, its
    folder (where a dice-spec imports sibling modules from). None: the pool's defaults ("kernel.cu")."""
    if not filename:
        return {}
    path = Path(filename)
    if not path.name:
        return {}
    kwargs: dict[str, Any] = {"filename": path.name}
    if path.parent != Path("."):
        kwargs["folder"] = str(path.parent)
    return kwargs
