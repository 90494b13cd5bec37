"""The one thread that runs the model for every HTTP request: requests that arrive together decode as one
batch, and each answers the moment its rows are done.

Why our own scheduler rather than a library's: the decode loop is ours (block diffusion, rows in lockstep,
``engine.decode``), and what a server needs from it is small: gather the waiting jobs whose decoding
settings match, run them as one ``Engine.generate`` call, stream every row after each block
(``on_block``), end a row that hit its stop string, budget or client disconnect (``until``), and stop the
call between denoising steps when every job in it was cancelled (``on_step``). A job that arrives while a
batch runs waits for the next one: the rows of one call share their K/V cache layout, so there is no
joining mid-flight (no continuous batching yet).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dice.serving.text import ChoiceText

log = logging.getLogger(__name__)
_unique = itertools.count(1)


@dataclass(frozen=True)
class DecodeKey:
    """Settings one ``Engine.generate`` call shares across its rows; jobs batch only with equal keys."""

    block_size: int
    steps_per_block: int
    policy: str
    threshold: float
    temperature: float
    top_p: float | None
    top_k: int | None
    stop_ids: tuple[int, ...]
    seed: int | None
    alone: int = 0  # a seeded job decodes alone, so that its seed alone decides its samples

    @classmethod
    def make(cls, **kw: Any) -> DecodeKey:
        alone = next(_unique) if kw.get("seed") is not None else 0
        return cls(alone=alone, **kw)


@dataclass
class Update:
    """What a job's sink receives, on the batcher's thread: a choice's new text/tokens, its finish, the
    job's end (``done``) or a failure (``error``)."""

    kind: str  # "delta" | "done" | "error"
    choice: int = -1
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    step_map: list[int] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    message: str = ""


@dataclass
class Job:
    """One HTTP request: ``prompts`` (token ids), ``n`` choices each, decoded with ``key``. Choice ``i * n +
    j`` is sample ``j`` of prompt ``i``; at temperature 0 the ``n`` samples of a prompt are one row."""

    prompts: list[list[int]]
    n: int
    max_tokens: int
    key: DecodeKey
    stop: tuple[str, ...]
    sink: Callable[[Update], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    created: float = field(default_factory=time.monotonic)
    started: float | None = None

    @property
    def greedy(self) -> bool:
        return self.key.temperature == 0

    def rows(self) -> list[tuple[list[int], list[int]]]:
        """(prompt, choices it answers) per decoded row."""
        if self.greedy:
            return [(p, [i * self.n + j for j in range(self.n)]) for i, p in enumerate(self.prompts)]
        return [(p, [i * self.n + j]) for i, p in enumerate(self.prompts) for j in range(self.n)]

    @property
    def row_count(self) -> int:
        return len(self.prompts) * (1 if self.greedy else self.n)


class _Row:
    def __init__(self, job: Job, choices: list[int], text: ChoiceText, index: int) -> None:
        self.job, self.choices, self.text, self.index = job, choices, text, index
        self.steps: list[int] = []
        self.confidences: list[float] = []
        self.reported = False  # its finish was sent


class Batcher:
    """Owns ``engine`` on one thread. ``submit(job)`` queues; the job's ``sink`` gets its updates.

    ``max_batch``: most rows per call; ``window_s``: how long the first job of an idle server waits for
    others to join it. ``observe`` (optional) gets ("batch", rows), ("steps", n), ("tokens", n) and
    ("queue_wait", seconds) for metrics.
    """

    def __init__(
        self,
        engine: Any,
        *,
        max_batch: int = 32,
        window_s: float = 0.005,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.engine = engine
        self.max_batch = max_batch
        self.window_s = window_s
        self.observe = observe or (lambda _what, _value: None)
        self.context = int(engine.config.max_position_embeddings)
        self._pending: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.running: list[Job] = []
        self.batches = 0
        self.failure: str | None = None  # set when the thread died (health then fails)
        self._thread = threading.Thread(target=self._loop, name="dice-serve-model", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------------------------- queue
    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the server is shutting down")
            self._pending.append(job)
            self._cond.notify()

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._pending)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.failure is None

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            for job in self._pending:
                job.sink(Update("error", message="the server is shutting down"))
            self._pending.clear()
            for job in self.running:
                job.cancelled.set()
            self._cond.notify_all()
        self._thread.join(timeout)

    def _next_batch(self) -> list[Job] | None:
        with self._cond:
            while not self._closed and not self._pending:
                self._cond.wait()
            if self._closed:
                return None
        if self.window_s > 0:
            time.sleep(self.window_s)  # let the jobs that arrive together join the first one
        with self._cond:
            batch: list[Job] = []
            rows = 0
            keep: collections.deque[Job] = collections.deque()
            longest = 0
            most_tokens = 0
            while self._pending:
                job = self._pending.popleft()
                if job.cancelled.is_set():
                    job.sink(Update("error", message="cancelled"))
                    continue
                if batch:
                    fits = (
                        job.key == batch[0].key
                        and rows + job.row_count <= self.max_batch
                        and max(longest, *map(len, job.prompts)) + max(most_tokens, job.max_tokens)
                        <= self.context
                    )
                    if not fits:
                        keep.append(job)
                        continue
                batch.append(job)
                rows += job.row_count
                longest = max(longest, *map(len, job.prompts))
                most_tokens = max(most_tokens, job.max_tokens)
            self._pending = keep
            self.running = batch
            return batch

    # ---------------------------------------------------------------------------------- the thread
    def _loop(self) -> None:
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                if batch:
                    self._run(batch)
                with self._cond:
                    self.running = []
        except BaseException as exc:  # noqa: BLE001 - recorded so /health reports it
            self.failure = f"{type(exc).__name__}: {exc}"
            log.exception("the model thread stopped")
            raise

    def _run(self, batch: list[Job]) -> None:
        """Long on purpose: one generate call and the three callbacks that stream, stop and cancel it."""
        from engine.errors import Cancelled

        now = time.monotonic()
        rows: list[_Row] = []
        prompts: list[list[int]] = []
        for job in batch:
            job.started = now
            self.observe("queue_wait", now - job.created)
            for prompt, choices in job.rows():
                text = ChoiceText(self.engine.tokenizer, max_tokens=job.max_tokens, stop=job.stop)
                rows.append(_Row(job, choices, text, len(rows)))
                prompts.append(prompt)
        self.batches += 1
        self.observe("batch", len(rows))
        open_rows = {job_id: 0 for job_id in map(id, batch)}
        for row in rows:
            open_rows[id(row.job)] += 1
        key = batch[0].key

        def until(i: int, ids: list[int]) -> bool:
            row = rows[i]
            row.text.update(ids)
            return row.text.finished or row.job.cancelled.is_set()

        def on_block(event: Any) -> None:
            for row in rows:
                if row.reported:
                    continue
                i = row.index
                row.text.update(event.ids[i], done=event.finished[i], stopped=event.stopped[i])
                if row.job.cancelled.is_set():
                    row.reported = True
                    continue
                self._send(row, event)
                if row.text.finished:
                    row.reported = True
                    open_rows[id(row.job)] -= 1
                    if open_rows[id(row.job)] == 0:
                        row.job.sink(Update("done"))

        def on_step(_event: Any) -> None:
            self.observe("steps", 1)
            if all(job.cancelled.is_set() for job in batch) or self._closed:
                raise Cancelled("cancel")

        try:
            self.engine.generate(
                prompts,
                max_new_tokens=max(job.max_tokens for job in batch),
                block_size=key.block_size,
                steps_per_block=key.steps_per_block,
                policy=key.policy,
                threshold=key.threshold,
                temperature=key.temperature,
                top_p=key.top_p,
                top_k=key.top_k,
                stop_ids=list(key.stop_ids),
                seed=key.seed,
                on_step=on_step,
                on_block=on_block,
                until=until,
            )
        except Cancelled:
            pass
        except Exception as exc:  # noqa: BLE001 - one failed batch answers its jobs, the server goes on
            log.exception("generation failed")
            for job in batch:
                if open_rows[id(job)] > 0:
                    job.sink(Update("error", message=f"generation failed: {type(exc).__name__}: {exc}"))
                    open_rows[id(job)] = 0
        for job in batch:  # a cancelled job, or rows the last block did not report
            if open_rows[id(job)] > 0 and job.cancelled.is_set():
                job.sink(Update("error", message="cancelled"))

    def _send(self, row: _Row, event: Any) -> None:
        i = row.index
        before = row.text.sent_tokens
        text, tokens = row.text.take_delta()
        steps = event.step_map[i][before : before + len(tokens)]
        confidences = event.confidences[i][before : before + len(tokens)]
        self.observe("tokens", len(tokens) * len(row.choices))
        if not (text or tokens or row.text.finished):
            return
        for choice in row.choices:
            row.job.sink(
                Update(
                    "delta",
                    choice=choice,
                    text=text,
                    token_ids=list(tokens),
                    step_map=list(steps),
                    confidences=list(confidences),
                    finish_reason=row.text.finish_reason,
                )
            )
