"""Per-request state shared by the coroutine that awaits a result and the model thread that computes it:
progress events, cancellation and the latency deadline."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from dice.assistant.types import Progress, Stage

ProgressCallback = Callable[[Progress], None]

# Progress events from the model thread are thinned to one per interval (the last one always goes out).
PROGRESS_INTERVAL_S = 0.05


class Request:
    """One request's progress sink, cancel signals and deadline (``max_latency_ms`` <= 0: none)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        progress: ProgressCallback | None,
        cancel: asyncio.Event | None,
        max_latency_ms: int,
    ) -> None:
        self.loop = loop
        self.progress = progress
        self.cancel = cancel
        self.stop = threading.Event()  # set when the awaiting task itself is cancelled
        self.deadline = time.monotonic() + max_latency_ms / 1000 if max_latency_ms > 0 else math.inf
        self.partial = False
        self.steps_done = 0
        self.steps_total = 0
        self._last_emit = 0.0
        self._loop_thread = threading.get_ident()

    @property
    def cancelled(self) -> bool:
        return self.stop.is_set() or (self.cancel is not None and self.cancel.is_set())

    @property
    def past_deadline(self) -> bool:
        return time.monotonic() > self.deadline

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise asyncio.CancelledError("request cancelled")

    def emit(self, stage: Stage, done: int, total: int, message: str, *, force: bool = True) -> None:
        """Send a progress event on the event loop's thread (safe to call from any thread)."""
        if self.progress is None:
            return
        now = time.monotonic()
        if not force and now - self._last_emit < PROGRESS_INTERVAL_S:
            return
        self._last_emit = now
        event = Progress(stage=stage, done=done, total=total, message=message)
        if threading.get_ident() == self._loop_thread:
            self.progress(event)
        elif not self.loop.is_closed():
            # a cancelled request's generation may outlive its loop by one step: drop its events then
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.progress, event)

    def on_step(self, *, respect_deadline: bool, message: str) -> Callable[[Any], None]:
        """The engine's ``on_step``: counts steps, reports them, and stops the generation when asked by
        raising ``engine.Cancelled`` with ``reason`` "cancel" or "deadline"."""
        from engine.errors import Cancelled

        def on_step(event: Any) -> None:
            if event is not None:  # None: a remote engine's heartbeat while it waits (no step was run)
                self.steps_done += 1
            done = min(self.steps_done, self.steps_total)
            self.emit("generating", done, self.steps_total, message, force=False)
            if self.cancelled:
                raise Cancelled("cancel")
            if respect_deadline and self.past_deadline:
                raise Cancelled("deadline")

        return on_step
