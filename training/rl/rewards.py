"""BiC-RL rewards: every sample's program judged by the validator, never trusted from the model.

:class:`ValidatorReward` turns each rollout into the program :func:`training.rl.tasks.program_from` assembles
and asks the validator:

- ``infill`` and ``e2e`` tasks: the KernelBench protocol through the batch API
  (:func:`dice.validator.batch.validate_many` on a :class:`~dice.validator.ValidatorPool`): reward 1 when the
  verdict is ``correct`` under the validator's full protocol (several input sets, the guards, the dependence
  check), 0 otherwise. A guard rejection earns 0 and its guard's name is kept. With ``speedup_term`` (e2e
  only; off by default, as in DICE) a correct sample earns ``0.3 + min(log2(speedup), 2)`` instead, the
  issue's capped term: note that a correct kernel slower than ~0.81x then earns less than a wrong one's 0.
  Timing runs on the GPU the rollouts use: score while no rollout decodes, or the speedups are skewed.
  Without the term nothing is timed (``timing=False``): the correctness trials on random seeds, the launch
  check and every trial guard run all the same; only the timing rounds' own checks (a fresh input set,
  ``outputs_not_ready``) are skipped.
  ``accept_compiled`` (CPU smoke runs only) also pays 1 for a ``compiled`` verdict, all a CPU pool gives.
- ``cu_infill`` tasks: the filled file through the pool's ``.cu`` validation (``submit_cu``: NVRTC on the
  device code, nvcc where it applies), the user's spec fingerprinted from the masked file (``spec_origin``),
  so a fill that adds, hides or changes the ``dice-spec`` is rejected (``fill_changes_spec``) rather than
  paid for compiling. Reward 1 when it compiles; when the file has a dice-spec and the pool has a GPU, only
  when the spec run is also ``correct``. A CPU pool gives compile-only verdicts: a reward the CPU computes.
  A blank fill (whitespace and comments) earns 0 without a compile (it compiles by construction), and so
  does a fill in code no compiler type-checked (``mark_unchecked``). A task whose file compiled only with
  its project's headers (:attr:`training.rl.tasks.Task.headers`) is compiled as if in that ``folder`` with
  those ``include_paths`` and an empty compile database of the reward's own, so no ``compile_commands.json``
  that happens to sit above the task folder lends its flags: each fill sees exactly the headers and flags
  its original compiled with when CuKe kept it.
  A compile check alone is a reward a candidate can fool: ``;``, ``return;`` or an unused declaration
  compile in almost any statement hole. So with ``cu_reward="match"`` (the default) a fill that is only
  compiled (no dice-spec run) earns ``MATCH_FLOOR + (1 - MATCH_FLOOR) * similarity(fill, target)``: the
  similarity of its C tokens (comments and layout ignored) to the hole's original text, 1 for the original
  itself. Compiling still separates 0 from the floor; only resembling what the author wrote earns the rest.
  ``cu_reward="compile"`` pays 1 for any compiled fill (DICE's binary reward, for comparison runs). A fill
  *run* against a dice-spec (``correct``) earns 1 either way: that check cannot be fooled by a no-op.

The validator's verdict cache: identical ``(task, program)`` samples of one batch are validated once and
share that verdict (the same text under the same check: the group's z-score sees them equal, as they are),
and before each batch the pool's own cache is cleared (``pool.clear_cache()``, unless ``reuse_verdicts``),
so a program seen in an earlier step is checked again, on fresh runs, rather than paid from memory.

Rewards of one step can be computed while the next rollout decodes: :meth:`ValidatorReward.submit` returns a
``concurrent.futures.Future`` (one scoring thread; the validation itself runs in the pool's workers).
"""

from __future__ import annotations

import concurrent.futures
import math
import re
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from training.cuke.cu_tasks import submit_task_file
from training.cuke.validate import guard_name
from training.rl.rollout import Rollout
from training.rl.tasks import Task, file_split, program_from

KERNELBENCH_KINDS = ("infill", "e2e")
CU_REWARDS = ("match", "compile")
MATCH_FLOOR = 0.2  # a compiled fill that resembles nothing of the original still beats a failing one (0)
_C_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|\.\d[\w.]*|->|<<|>>|[-+*/%&|^!=<>]=|&&|\|\||\+\+|--|::|\S")
DEFAULT_DEADLINE_S = 900.0
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


@dataclass(frozen=True)
class Scored:
    """One sample's reward and why: ``status`` is the verdict's (or ``blank``, ``not_checked``, ``toy``);
    ``guard`` the guard that rejected it; ``passed`` whether it counts as solved (for the pass rate, which a
    speedup term's negative rewards must not hide)."""

    reward: float
    status: str
    guard: str | None = None
    speedup: float | None = None
    message: str = ""
    passed: bool = False
    exact: bool = False  # a .cu fill whose tokens equal the hole's original (comments and layout aside)


class RewardFn(Protocol):
    """Scores ``rollouts[i][j]`` (task ``tasks[i]``, sample ``j``) as ``result[i][j]``."""

    def __call__(
        self, tasks: Sequence[Task], rollouts: Sequence[Sequence[Rollout]]
    ) -> list[list[Scored]]: ...

    def submit(
        self, tasks: Sequence[Task], rollouts: Sequence[Sequence[Rollout]]
    ) -> concurrent.futures.Future[list[list[Scored]]]: ...


SPEEDUP_FLOOR = 0.05  # a correct sample always earns more than an incorrect one (0)


def speedup_reward(speedup: float | None) -> float:
    """``0.3 + min(log2(speedup), 2)`` for a correct sample, floored at ``SPEEDUP_FLOOR`` so that a correct
    but slow kernel never scores below a wrong one (the issue's formula alone gives 0.5x -> -0.7); 0.3 when
    no finite positive speedup was measured (correct, untimed), the cap when it is infinite."""
    if speedup is None or math.isnan(speedup) or speedup <= 0:
        return 0.3
    return max(SPEEDUP_FLOOR, 0.3 + min(math.log2(speedup), 2.0))


def code_tokens(text: str) -> list[str]:
    """C/C++ tokens of ``text``, comments dropped (layout never matters)."""
    return _C_TOKEN.findall(_COMMENTS.sub(" ", text))


def similarity(fill: str, target: str) -> float:
    """How much of ``target``'s token sequence ``fill`` reproduces: difflib's ratio over :func:`code_tokens`
    (2 * matched / total; 1.0 when the tokens are equal). The standard library's matcher: statements are a
    few dozen tokens, so its quadratic worst case costs nothing here."""
    import difflib

    a, b = code_tokens(fill), code_tokens(target)
    if a == b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def blank_fill(text: str) -> bool:
    """Whitespace and comments only (such a fill changes nothing a compiler sees)."""
    return not _COMMENTS.sub("", text).strip()


class ToyReward:
    """1 when the response contains ``target`` (a token id among ``response_ids``, or a string in
    ``text``), else 0: a reward a tiny model can learn in a few CPU steps (tests, smoke runs)."""

    def __init__(self, target: str | int) -> None:
        self.target = target

    def score(self, rollout: Rollout) -> Scored:
        if isinstance(self.target, int):
            hit = self.target in rollout.response_ids
        else:
            hit = self.target in rollout.text
        return Scored(1.0 if hit else 0.0, "toy", passed=hit)

    def __call__(self, tasks: Sequence[Task], rollouts: Sequence[Sequence[Rollout]]) -> list[list[Scored]]:
        _check_shapes(tasks, rollouts)
        return [[self.score(r) for r in group] for group in rollouts]

    def submit(
        self, tasks: Sequence[Task], rollouts: Sequence[Sequence[Rollout]]
    ) -> concurrent.futures.Future[list[list[Scored]]]:
        future: concurrent.futures.Future[list[list[Scored]]] = concurrent.futures.Future()
        try:
            future.set_result(self(tasks, rollouts))
        except Exception as exc:  # noqa: BLE001 - delivered through the future, as a real submit would
            future.set_exception(exc)
        return future


def _check_shapes(tasks: Sequence[Task], rollouts: Sequence[Sequence[Rollout]]) -> None:
    if len(tasks) != len(rollouts):
        raise ValueError(f"{len(tasks)} tasks but {len(rollouts)} rollout groups")
    for task, group in zip(tasks, rollouts, strict=True):
        stray = next((r.task_id for r in group if r.task_id != task.id), None)
        if stray is not None:
            raise ValueError(f"a rollout of task {stray!r} in the group of task {task.id!r}")


@dataclass(frozen=True)
class _Job:
    """One distinct program to validate, and the samples that share it."""

    task: Task
    program: str
    samples: list[tuple[int, int]]


class ValidatorReward:
    """The validator's verdicts as rewards (module docstring). ``pool``: a ``ValidatorPool`` (or anything
    with its ``submit_kernelbench`` / ``submit_cu``, ``workers``, ``gpu``: tests stub it). ``deadline_s``:
    per validation, from when it is taken (a ``timeout`` verdict, reward 0, past it). ``strict``: the
    KernelBench 1e-4 tolerance instead of 1e-2. The pool is the caller's: :meth:`close` stops only the
    scoring thread."""

    def __init__(
        self,
        pool: Any,
        *,
        speedup_term: bool = False,
        deadline_s: float | None = DEFAULT_DEADLINE_S,
        strict: bool = False,
        accept_compiled: bool = False,
        reuse_verdicts: bool = False,
        cu_reward: str = "match",
    ) -> None:
        if cu_reward not in CU_REWARDS:
            raise ValueError(f"cu_reward must be one of {', '.join(CU_REWARDS)}, got {cu_reward!r}")
        self.cu_reward = cu_reward
        self.pool = pool
        self.speedup_term = speedup_term
        self.deadline_s = deadline_s
        self.strict = strict
        self.accept_compiled = accept_compiled
        self.reuse_verdicts = reuse_verdicts
        self.last_stats: dict[str, Any] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._no_database: tempfile.TemporaryDirectory[str] | None = None

    # ------------------------------------------------------------------------------------------ public
    def __call__(self, tasks: Sequence[Task], rollouts: Sequence[Sequence[Rollout]]) -> list[list[Scored]]:
        return self.score(tasks, rollouts)

    def submit(
        self, tasks: Sequence[Task], rollouts: Sequence[Sequence[Rollout]]
    ) -> concurrent.futures.Future[list[list[Scored]]]:
        """Score in the background (one batch after another, in submission order)."""
        _check_shapes(tasks, rollouts)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dice-rl-reward")
        return self._executor.submit(self.score, list(tasks), [list(g) for g in rollouts])

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._no_database is not None:
            self._no_database.cleanup()
            self._no_database = None

    def __enter__(self) -> ValidatorReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def score(self, tasks: Sequence[Task], rollouts: Sequence[Sequence[Rollout]]) -> list[list[Scored]]:
        """Validate every distinct program once and give each sample its reward (blocking)."""
        _check_shapes(tasks, rollouts)
        started = time.monotonic()
        out: list[list[Scored | None]] = [[None] * len(g) for g in rollouts]
        jobs: dict[tuple[str, str], _Job] = {}
        for i, (task, group) in enumerate(zip(tasks, rollouts, strict=True)):
            for j, sample in enumerate(group):
                program = program_from(task, sample.text)
                if task.kind == "cu_infill" and blank_fill(_fill_of(task, program)):
                    out[i][j] = Scored(0.0, "blank", message="blank fill (whitespace and comments only)")
                    continue
                if task.kind not in (*KERNELBENCH_KINDS, "cu_infill"):
                    raise ValueError(f"task {task.id!r}: the validator cannot score {task.kind!r} tasks")
                job = jobs.setdefault((task.id, program), _Job(task, program, []))
                job.samples.append((i, j))
        if not self.reuse_verdicts and hasattr(self.pool, "clear_cache"):
            self.pool.clear_cache()
        kb = [job for job in jobs.values() if job.task.kind in KERNELBENCH_KINDS]
        cu = [job for job in jobs.values() if job.task.kind == "cu_infill"]
        origins = _spec_origins(job.task for job in cu)
        verdicts = self._kernelbench(kb)
        verdicts.update(self._cu(cu, origins))
        for key, job in jobs.items():
            has_spec = job.task.id in origins and origins[job.task.id].source is not None
            scored = self._scored(job.task, verdicts[key], has_spec, job.program)
            for i, j in job.samples:
                out[i][j] = scored
        self.last_stats = {
            "samples": sum(len(g) for g in rollouts),
            "validated": len(jobs),
            "kernelbench": len(kb),
            "cu": len(cu),
            "seconds": round(time.monotonic() - started, 3),
        }
        return [[s for s in row if s is not None] for row in out]

    # ------------------------------------------------------------------------------------------ internals
    def _kernelbench(self, jobs: list[_Job]) -> dict[tuple[str, str], Any]:
        from dice.validator.batch import BatchTask, validate_many

        tasks = (
            BatchTask(
                job.task.record["pytorch_code"],
                job.program,
                strict=self.strict,
                timing=self.speedup_term and job.task.kind == "e2e",
                deadline_s=self.deadline_s,
                key=(job.task.id, job.program),
            )
            for job in jobs
        )
        return {task.key: verdict for task, verdict in validate_many(self.pool, tasks)}

    def _cu(self, jobs: list[_Job], origins: dict[str, Any]) -> dict[tuple[str, str], Any]:
        """``submit_cu`` with at most twice the pool's width in flight, each with its deadline from when it
        was submitted (validate_many's rule, for the ``.cu`` path it does not cover)."""
        from dice.validator.verdict import Verdict, error_verdict, mark_unchecked

        width = max(1, int(getattr(self.pool, "workers", 1)))
        pending = deque(jobs)
        live: dict[concurrent.futures.Future[Any], tuple[_Job, float | None]] = {}
        abandoned: set[concurrent.futures.Future[Any]] = set()
        results: dict[tuple[str, str], Any] = {}
        while pending or live:
            abandoned = {f for f in abandoned if not f.done()}
            while pending and len(live) + len(abandoned) < 2 * width:
                job = pending.popleft()
                future = self._submit_cu(job, origins[job.task.id])
                deadline = None if self.deadline_s is None else time.monotonic() + self.deadline_s
                live[future] = (job, deadline)
            deadlines = [d for _job, d in live.values() if d is not None]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            waits = set(live) | abandoned
            concurrent.futures.wait(waits, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)
            now = time.monotonic()
            for future in list(live):
                job, deadline = live[future]
                if future.done():
                    del live[future]
                    exc = None if future.cancelled() else future.exception()
                    verdict = (
                        error_verdict("runtime_error", f"validator internal error: {exc}")
                        if future.cancelled() or exc is not None
                        else mark_unchecked(future.result(), file_split(job.task)[0].count("\n"))
                    )
                    results[(job.task.id, job.program)] = verdict
                elif deadline is not None and now >= deadline:
                    del live[future]
                    if not future.cancel():
                        abandoned.add(future)
                    results[(job.task.id, job.program)] = Verdict(
                        "timeout",
                        False,
                        None,
                        message=f"timed out: the deadline ({self.deadline_s:g} s) passed",
                    )
        return results

    def _submit_cu(self, job: _Job, origin: Any) -> concurrent.futures.Future[Any]:
        """``submit_cu`` of a filled file: alone, or in its task's folder with its include paths."""
        headers = job.task.headers
        if headers is None:
            return submit_task_file(self.pool, job.program, run=True, spec_origin=origin)
        if self._no_database is None:
            self._no_database = tempfile.TemporaryDirectory(prefix="dice-rl-no-compdb-")
        return submit_task_file(
            self.pool,
            job.program,
            folder=headers.folder,
            include_paths=headers.include_paths,
            empty_database=f"{self._no_database.name}/compile_commands.json",
            run=True,
            spec_origin=origin,
        )

    def _scored(self, task: Task, verdict: Any, has_spec: bool, program: str) -> Scored:
        from dice.validator.verdict import FLAG_FILL_NOT_CHECKED

        speedup = verdict.speedup if verdict.speedup is not None and math.isfinite(verdict.speedup) else None
        message = (verdict.message or "").splitlines()[0][:300] if verdict.message else ""
        guard = guard_name(verdict.message) if verdict.status == "rejected" else None
        status = verdict.status
        if task.kind == "cu_infill":
            if FLAG_FILL_NOT_CHECKED in verdict.flags:
                return Scored(0.0, "not_checked", None, speedup, message)
            must_run = has_spec and bool(getattr(self.pool, "gpu", False))
            ok = status == "correct" if must_run else status in ("compiled", "correct")
            fill, target = _fill_of(task, program), str(task.record.get("target", ""))
            sim = similarity(fill, target) if ok else 0.0
            reward = 0.0
            if ok:
                ran = must_run or status == "correct"
                only_compiled = self.cu_reward == "match" and not ran
                reward = MATCH_FLOOR + (1.0 - MATCH_FLOOR) * sim if only_compiled else 1.0
            return Scored(reward, status, guard, speedup, message, passed=ok, exact=ok and sim == 1.0)
        if status == "correct":
            reward = speedup_reward(speedup) if self.speedup_term and task.kind == "e2e" else 1.0
            return Scored(reward, status, guard, speedup, message, passed=True)
        ok = self.accept_compiled and status == "compiled"
        return Scored(1.0 if ok else 0.0, status, guard, speedup, message, passed=ok)


def _spec_origins(tasks: Any) -> dict[str, Any]:
    """The user's spec of each ``.cu`` task, fingerprinted from the masked file (``spec_origin``): what the
    validator runs, and what no fill may change. Its ``source`` says whether the file has a dice-spec."""
    from dice.cuda_source import parse_document
    from dice.validator.spec_origin import spec_origin

    origins: dict[str, Any] = {}
    for task in tasks:
        if task.id not in origins:
            origins[task.id] = spec_origin(parse_document(task.record["text"]))
    return origins


def _fill_of(task: Task, program: str) -> str:
    """The middle of a ``.cu`` program (the filled file less the text around the hole)."""
    prefix, suffix = file_split(task)
    return program[len(prefix) : len(program) - len(suffix)]
