"""Many KernelBench validations at once, for training and evaluation: a stream of tasks in, verdicts out as
they finish.

:func:`validate_many` takes an iterable of :class:`BatchTask` (possibly lazy or endless: a sampler, a
generator reading files) and yields ``(task, verdict)`` in completion order. It keeps at most ``K`` tasks in
flight (default twice the pool's width) and takes a task from the input only when there is room, so the input
is never drained ahead. A task's ``deadline_s`` (counted from when it was taken) gives it a ``timeout``
verdict that says where it was when the deadline passed (waiting for its group's prebuild, queued in the
pool, or running). A pool that has ``submit_prebuild(cand_srcs) -> Future[dict]`` (one build of many
candidates' extensions) gets the candidates of each group of up to ``G`` tasks taken together before their
own tasks are submitted, so those find their extensions in the on-disk cache; without it (or with
``prebuild=False``) every task builds its own. :class:`BatchStats` counts tasks per minute (overall and over
a recent window), statuses, builds against cache hits (the verdict log's ``builds: ...`` line), prebuilds and
deadline timeouts.

The pool spreads its workers over every GPU of the machine (worker ``i`` on GPU ``i % n``; runs and timings
are serialised per GPU, builds run in every worker): :func:`gpu_spread` says how. Nothing here runs a
candidate: everything goes through the pool's worker processes.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dice.validator.verdict import FLAG_TIMING_STOPPED, GPU_LOCK_LINE, Verdict, error_verdict

_BUILD_ITEM = re.compile(r"\((cached|built) [0-9.]+ s\)")
_GPU_LOCK = re.compile(re.escape(GPU_LOCK_LINE) + r" waited ([0-9.]+) s, held ([0-9.]+) s")


@dataclass(frozen=True)
class BatchTask:
    """One KernelBench validation: reference and candidate sources, the options of
    ``ValidatorPool.submit_kernelbench``, a deadline in seconds from when :func:`validate_many` takes the task
    (None: only the pool's own phase limits), and ``key``, anything the caller wants back with the verdict."""

    ref_src: str
    cand_src: str
    strict: bool = False
    timing: bool = True
    deadline_s: float | None = None
    key: Any = None
    stop_below: float | None = None  # the pool's early stop of timing (a dataset build's cut-off)


def gpu_lock_seconds(log: str) -> tuple[float, float]:
    """(seconds waited for, seconds held) of the GPU's lock, from a verdict log's ``gpu lock: waited 1.20 s,
    held 3.40 s`` line (:mod:`dice.validator.kernelbench`); (0, 0) without one."""
    m = _GPU_LOCK.search(log or "")
    return (float(m.group(1)), float(m.group(2))) if m else (0.0, 0.0)


def count_builds(log: str) -> tuple[int, int]:
    """(extensions built, extensions loaded from the cache) on the ``builds: ...`` lines of a verdict log
    (:func:`dice.validator.builds.describe_builds`: ``builds: ext (cached 0.3 s), other (built 41.0 s)``)."""
    built = cached = 0
    for line in (log or "").splitlines():
        if line.lstrip().startswith("builds:"):
            for kind in _BUILD_ITEM.findall(line):
                built += kind == "built"
                cached += kind == "cached"
    return built, cached


@dataclass
class BatchStats:
    """What a :func:`validate_many` run did so far; ``window_s`` is the span of the recent rate."""

    window_s: float = 120.0
    started_at: float | None = None
    admitted: int = 0  # tasks taken from the input
    finished: int = 0  # verdicts yielded
    statuses: Counter[str] = field(default_factory=Counter)
    builds_built: int = 0
    builds_cached: int = 0
    deadline_timeouts: int = 0
    abandoned: int = 0  # running tasks whose deadline passed (their worker still finishes them)
    dropped: int = 0  # tasks in flight when the run stopped (budget, consumer stopped): no verdict
    prebuild_calls: int = 0
    prebuild_candidates: int = 0
    prebuild_failures: int = 0
    prebuild_seconds: float = 0.0
    gpu_held_s: float = 0.0  # the verdict logs' "gpu lock: ... held X s" (one GPU's lock is one serial run)
    gpu_wait_s: float = 0.0
    timing_stopped_early: int = 0  # verdicts whose timing ended after the pilot (BatchTask.stop_below)
    _finish_times: deque[float] = field(default_factory=deque, repr=False)

    def start(self, now: float | None = None) -> None:
        if self.started_at is None:
            self.started_at = time.monotonic() if now is None else now

    def record(self, verdict: Verdict, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.start(now)
        self.finished += 1
        self.statuses[verdict.status] += 1
        built, cached = count_builds(verdict.log)
        self.builds_built += built
        self.builds_cached += cached
        waited, held = gpu_lock_seconds(verdict.log)
        self.gpu_wait_s += waited
        self.gpu_held_s += held
        self.timing_stopped_early += FLAG_TIMING_STOPPED in (verdict.flags or [])
        self._finish_times.append(now)
        while self._finish_times and self._finish_times[0] < now - self.window_s:
            self._finish_times.popleft()

    def elapsed_s(self, now: float | None = None) -> float:
        if self.started_at is None:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self.started_at)

    def per_minute(self, now: float | None = None) -> float:
        """Verdicts per minute since the first task was taken."""
        elapsed = self.elapsed_s(now)
        return 60.0 * self.finished / elapsed if elapsed > 0 else 0.0

    def recent_per_minute(self, now: float | None = None) -> float:
        """Verdicts per minute over the last ``window_s`` seconds (or since the start, when shorter)."""
        now = time.monotonic() if now is None else now
        span = min(self.window_s, self.elapsed_s(now))
        recent = sum(1 for t in self._finish_times if t >= now - self.window_s)
        return 60.0 * recent / span if span > 0 else 0.0

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        return {
            "elapsed_s": round(self.elapsed_s(now), 1),
            "admitted": self.admitted,
            "finished": self.finished,
            "per_minute": round(self.per_minute(now), 2),
            "recent_per_minute": round(self.recent_per_minute(now), 2),
            "window_s": self.window_s,
            "statuses": dict(self.statuses),
            "builds_built": self.builds_built,
            "builds_cached": self.builds_cached,
            "deadline_timeouts": self.deadline_timeouts,
            "abandoned": self.abandoned,
            "dropped": self.dropped,
            "prebuild_calls": self.prebuild_calls,
            "prebuild_candidates": self.prebuild_candidates,
            "prebuild_failures": self.prebuild_failures,
            "prebuild_seconds": round(self.prebuild_seconds, 1),
            "gpu_held_s": round(self.gpu_held_s, 1),
            "gpu_wait_s": round(self.gpu_wait_s, 1),
            "timing_stopped_early": self.timing_stopped_early,
        }

    def describe(self, now: float | None = None) -> str:
        """One line, e.g. ``40 verdicts in 3.2 min: 12.5/min (last 120 s: 14.0/min); builds: 9 built, 31
        cached; correct 30, incorrect 10``."""
        text = (
            f"{self.finished} verdicts in {self.elapsed_s(now) / 60:.1f} min: {self.per_minute(now):.1f}/min "
            f"(last {self.window_s:.0f} s: {self.recent_per_minute(now):.1f}/min); "
            f"builds: {self.builds_built} built, {self.builds_cached} cached"
        )
        if self.prebuild_calls or self.prebuild_failures:
            text += (
                f"; prebuilds: {self.prebuild_calls} ({self.prebuild_candidates} candidates, "
                f"{self.prebuild_seconds:.0f} s, {self.prebuild_failures} failed)"
            )
        if self.gpu_held_s:
            text += f"; GPU held {self.gpu_held_s:.0f} s"
        if self.timing_stopped_early:
            text += f"; timing stopped early {self.timing_stopped_early}"
        if self.deadline_timeouts:
            text += f"; {self.deadline_timeouts} past their deadline"
        if self.dropped:
            text += f"; {self.dropped} dropped unfinished"
        if self.statuses:
            text += "; " + ", ".join(f"{s} {n}" for s, n in self.statuses.most_common())
        return text


def gpu_spread(pool: Any) -> dict[str, int]:
    """Workers per GPU of a :class:`~dice.validator.pool.ValidatorPool` (``{"gpu0": 4, "gpu1": 4}``;
    ``{"cpu": n}`` without a GPU). The pool pins worker ``i`` to GPU ``i % n``, n = every visible GPU."""
    indices = getattr(pool, "_gpu_indices", None) or [None] * int(getattr(pool, "workers", 1))
    spread = Counter("cpu" if i is None else f"gpu{i}" for i in indices)
    return dict(sorted(spread.items()))


def validate_many(
    pool: Any,
    tasks: Iterable[BatchTask],
    *,
    max_in_flight: int | None = None,
    group_size: int | None = None,
    prebuild: bool = True,
    budget_s: float | None = None,
    stats: BatchStats | None = None,
) -> Iterator[tuple[BatchTask, Verdict]]:
    """Validate ``tasks`` on ``pool``; yield ``(task, verdict)`` as each finishes (completion order).

    ``max_in_flight`` (K, default ``2 * pool.workers``): tasks taken from the input and not yet answered,
    running tasks abandoned at their deadline included (they still hold a worker). ``group_size`` (G, default
    a quarter of ``pool.workers``, at least 2, at most K): with ``prebuild`` and a pool that has
    ``submit_prebuild``, tasks are taken in groups of G (a smaller one when nothing is in flight) and the
    group's ``load_inline`` candidates are prebuilt in one call before their tasks are submitted (a failed
    prebuild only means each task builds its own). ``budget_s``: after that many seconds the run ends: queued
    tasks are cancelled, running ones left to their workers, and neither gets a verdict (``stats.dropped``);
    the same happens when the caller stops iterating. A reference that is not a KernelBench problem gets a
    ``runtime_error`` verdict saying so.
    ``stats`` (a :class:`BatchStats`) is filled as the run goes.
    """
    width = max(1, int(getattr(pool, "workers", 1)))
    k = max(1, max_in_flight if max_in_flight is not None else 2 * width)
    # a combined build is one nvcc + one g++ process: groups of a quarter of the pool keep ~4x as many of
    # them running at once, each sharing the headers 4 ways (with groups as wide as the pool and K = 2x its
    # width, at most 2 combined builds run at once on a 16-core H200 host)
    g = max(1, min(k, group_size if group_size is not None else min(width, max(2, width // 4))))
    submit_prebuild = getattr(pool, "submit_prebuild", None) if prebuild and g > 1 else None
    batch = _Batch(pool, iter(tasks), k, g, submit_prebuild, stats if stats is not None else BatchStats())
    return batch.run(budget_s)


@dataclass
class _Entry:
    task: BatchTask
    deadline: float | None
    future: concurrent.futures.Future[Verdict] | None = None
    group: concurrent.futures.Future[Any] | None = None  # the prebuild it waits for
    ready: Verdict | None = None  # answered without the pool (bad reference)


class _Batch:
    """The state of one :func:`validate_many` run (driven by its generator, in the caller's thread)."""

    def __init__(
        self, pool: Any, source: Iterator[BatchTask], k: int, g: int, submit_prebuild: Any, stats: BatchStats
    ) -> None:
        self.pool = pool
        self.source = source
        self.k = k
        self.g = g
        self.submit_prebuild = submit_prebuild
        self.stats = stats
        self.exhausted = False
        self.live: list[_Entry] = []
        self.groups: dict[concurrent.futures.Future[Any], float] = {}  # prebuild -> when it was submitted
        self.abandoned: set[concurrent.futures.Future[Verdict]] = set()
        self.answered: deque[tuple[_Entry, Verdict]] = deque()  # collected, not yet yielded

    def run(self, budget_s: float | None) -> Iterator[tuple[BatchTask, Verdict]]:
        now = time.monotonic()
        self.stats.start(now)
        end = None if budget_s is None else now + budget_s
        try:
            while end is None or time.monotonic() < end:
                self._admit()
                self._finish_prebuilds()
                self.answered.extend(self._collect(time.monotonic()))
                if self.answered:
                    while self.answered:
                        entry, verdict = self.answered.popleft()
                        self.stats.record(verdict)
                        yield entry.task, verdict
                    continue
                if not self.live and self.exhausted:
                    return
                self._wait(end)
        finally:
            self._stop()

    # ---------------------------------------------------------------------------------------- taking tasks
    def _admit(self) -> None:
        """Take tasks while there is room: one at a time without prebuilds; with them, whole groups (a
        smaller one only when nothing is in flight), so that groups stay whole."""
        while not self.exhausted:
            room = self.k - len(self.live) - len(self.abandoned)
            if room <= 0:
                return
            if self.submit_prebuild is None:
                self._take(room)
            elif room >= self.g or not self.live:
                self._take(min(self.g, room))
            else:
                return

    def _take(self, want: int) -> None:
        group: list[_Entry] = []
        for _ in range(want):
            try:
                task = next(self.source)
            except StopIteration:
                self.exhausted = True
                break
            now = time.monotonic()
            deadline = None if task.deadline_s is None else now + float(task.deadline_s)
            group.append(_Entry(task, deadline))
            self.stats.admitted += 1
        self.live += group
        self._dispatch(group)

    def _dispatch(self, group: list[_Entry]) -> None:
        """Submit a group's tasks, after one prebuild of its ``load_inline`` candidates when the pool can."""
        builds = [e for e in group if "load_inline" in e.task.cand_src]
        first_refs: dict[str, str] = {}  # each distinct candidate once, with its reference (init inputs for
        for e in builds:  # a candidate that builds in __init__)
            first_refs.setdefault(e.task.cand_src, e.task.ref_src)
        sources, refs = list(first_refs), list(first_refs.values())
        future = None
        if self.submit_prebuild is not None and len(sources) > 1:
            try:
                future = self._prebuild(sources, refs)
            except Exception:  # noqa: BLE001 - a prebuild is an optimisation; each task still builds its own
                self.stats.prebuild_failures += 1
        if future is not None:
            self.stats.prebuild_calls += 1
            self.stats.prebuild_candidates += len(sources)
            self.groups[future] = time.monotonic()
            for entry in builds:
                entry.group = future
        for entry in group:
            if entry.group is None:
                self._submit(entry)

    def _prebuild(self, sources: list[str], refs: list[str]) -> Any:
        try:
            return self.submit_prebuild(sources, refs=refs)
        except TypeError:  # a pool whose submit_prebuild takes the sources alone
            return self.submit_prebuild(sources)

    def _submit(self, entry: _Entry) -> None:
        task = entry.task
        try:
            extra = {} if task.stop_below is None else {"stop_below": task.stop_below}
            entry.future = self.pool.submit_kernelbench(
                task.ref_src, task.cand_src, strict=task.strict, timing=task.timing, **extra
            )
        except ValueError as exc:  # InvalidReference
            entry.ready = error_verdict("runtime_error", f"the reference is not a KernelBench problem: {exc}")

    def _finish_prebuilds(self) -> None:
        for future in [f for f in self.groups if f.done()]:
            started = self.groups.pop(future)
            self.stats.prebuild_seconds += time.monotonic() - started
            if future.cancelled() or future.exception() is not None:
                self.stats.prebuild_failures += 1
            for entry in self.live:
                if entry.group is future:
                    entry.group = None
                    self._submit(entry)

    # ---------------------------------------------------------------------------------------- answers
    def _collect(self, now: float) -> list[tuple[_Entry, Verdict]]:
        """The entries answered or past their deadline, in the order they were taken."""
        self.abandoned = {f for f in self.abandoned if not f.done()}
        done: list[tuple[_Entry, Verdict]] = []
        for entry in self.live:
            verdict = entry.ready
            if verdict is None and entry.future is not None and entry.future.done():
                verdict = _result(entry.future)
            if verdict is None and entry.deadline is not None and now >= entry.deadline:
                verdict = self._expire(entry)
            if verdict is not None:
                done.append((entry, verdict))
        answered = {id(e) for e, _ in done}
        self.live = [e for e in self.live if id(e) not in answered]
        return done

    def _expire(self, entry: _Entry) -> Verdict:
        self.stats.deadline_timeouts += 1
        limit = f"the task's deadline ({entry.task.deadline_s:g} s)"
        if entry.future is None:
            where = "while it waited for the batched prebuild of its group; it was never validated"
        elif entry.future.cancel():
            where = "while it was queued; it was never started"
        else:
            self.abandoned.add(entry.future)
            self.stats.abandoned += 1
            where = (
                "while it was running; its worker finishes it or stops at the pool's own phase limits, and "
                "that result is dropped"
            )
        return Verdict("timeout", False, None, message=f"timed out: {limit} passed {where}")

    def _wait(self, end: float | None) -> None:
        waits = {e.future for e in self.live if e.future is not None} | set(self.groups) | self.abandoned
        now = time.monotonic()
        times = [e.deadline for e in self.live if e.deadline is not None] + ([end] if end is not None else [])
        timeout = max(0.0, min(times) - now) if times else None
        if waits:
            concurrent.futures.wait(waits, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)
        elif timeout is not None:
            time.sleep(min(timeout, 0.05))

    def _stop(self) -> None:
        """The run ended early: cancel what is queued; what runs is left to its worker."""
        self.stats.dropped += len(self.answered)
        self.answered.clear()
        for entry in self.live:
            self.stats.dropped += 1
            if entry.future is not None:
                entry.future.cancel()
        for future in self.groups:
            future.cancel()
        self.live = []
        self.groups = {}


def _result(future: concurrent.futures.Future[Verdict]) -> Verdict:
    if future.cancelled():
        return error_verdict("runtime_error", "the validation was cancelled outside validate_many")
    exc = future.exception()
    if exc is not None:
        return error_verdict("runtime_error", f"validator internal error: {exc}")
    return future.result()
